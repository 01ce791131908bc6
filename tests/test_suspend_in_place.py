"""A suspend in place (a cross-machine move's: gmux.job.job): the job waits at its boundary without copying its
state out, its checkpoint comes from live memory and equals one taken after a real suspend, and it runs on
bit-identical after a resume that copies nothing back, or after a real suspend asked for while it waits."""
import threading

from gmux_testkit import assert_identical
from test_runtime import _setup, _values


def _drive(job, step, commands, probe=lambda: None):
    """Steps the job while a driver thread sends `commands` [(kind, args)] one after the other, each once the
    previous has been answered; returns the answers, each with what `probe()` saw just after it."""
    c, answers = job.controller, []

    def driver():
        for kind, args in commands:
            answers.append(c.result(c.send(kind, **args), timeout=20))
            answers[-1]["probe"] = probe()

    t = threading.Thread(target=driver)
    t.start()
    while t.is_alive():
        step()
    t.join()
    return answers


def _twin(steps):
    """The same job (same seed), run `steps` steps with no interruption: its values."""
    job, _, _, step = _setup()
    for _ in range(steps):
        step()
    return job, step


def test_in_place_copies_nothing_and_its_checkpoint_equals_a_suspended_one(tmp):
    job, _, _, step = _setup()
    for _ in range(3):
        step()
    weight = job.tracked.tensors()[0]      # a real suspend leaves it with no elements until the resume
    answers = _drive(job, step, [("suspend", {"in_place": True}), ("checkpoint", {"path": f"{tmp}/held.ckpt"}),
                                 ("spill", {"path": f"{tmp}/spill"}), ("resume", {})], weight.numel)
    held, written, spill, resumed = answers
    assert held == {"ok": True, "in_place": True, "bytes": 0, "total_s": 0.0, "probe": weight.numel()}
    assert weight.numel() > 0                      # (held in place, the weight kept its memory)
    assert written["ok"] and written["step"] >= 3
    assert not spill["ok"] and "held in place" in spill["error"]
    assert resumed["ok"] and resumed["in_place"] and resumed["bytes"] == 0
    assert job.profile.suspends == 0 and not job.suspended

    # The same state through a real suspend, in the twin, gives the same bytes.
    twin, _ = _twin(written["step"])
    twin.suspend()
    twin.checkpoint(f"{tmp}/suspended.ckpt")
    twin.resume()
    with open(f"{tmp}/held.ckpt", "rb") as a, open(f"{tmp}/suspended.ckpt", "rb") as b:
        assert a.read() == b.read()


def test_a_job_held_in_place_runs_on_bit_identical():
    job, _, _, step = _setup()
    for _ in range(2):
        step()
    _drive(job, step, [("suspend", {"in_place": True}), ("resume", {})])
    for _ in range(3):
        step()
    twin, _ = _twin(job.profile.steps)
    assert_identical(_values(twin), _values(job))


def test_told_to_suspend_while_held_in_place_it_suspends_for_real():
    # gmuxd may need its memory (a move in its own process): the held job copies its state out then.
    job, _, _, step = _setup()
    step()
    weight = job.tracked.tensors()[0]
    answers = _drive(job, step, [("suspend", {"in_place": True}), ("suspend", {}), ("resume", {})], weight.numel)
    held, real, resumed = answers
    assert held["in_place"] and held["probe"] > 0
    assert real["ok"] and real["bytes"] > 0 and "in_place" not in real and real["probe"] == 0
    assert resumed["ok"] and resumed["bytes"] > 0 and "in_place" not in resumed
    assert job.profile.suspends == 1
    step()
    twin, _ = _twin(job.profile.steps)
    assert_identical(_values(twin), _values(job))


def test_a_second_suspend_of_a_really_suspended_job_is_still_refused():
    job, _, _, step = _setup()
    step()
    answers = _drive(job, step, [("suspend", {}), ("suspend", {}), ("resume", {})])
    assert answers[1] == {"ok": False, "error": "suspend: the job is suspended", "probe": None}
    assert answers[0]["bytes"] > 0 and "in_place" not in answers[0] and answers[2]["ok"]
