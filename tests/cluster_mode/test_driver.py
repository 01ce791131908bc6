"""The policy driver: the snapshot it builds from the scheduler's tables, and how each action becomes a daemon
intent (pure: no processes)."""
import json
import os

import pytest

from gmux.cluster.policies import (Event, EventKind, Grow, JobState, Migrate, Pack, Place, Resume, SetTimer,
                                   Suspend, Unpack, make_policy)
from gmux.cluster.scheduler.driver import Driver
from gmux.cluster.scheduler.state import CJob, Machine

GPUS = [{"index": 0, "mem_total": 8 << 30}, {"index": 1, "mem_total": 8 << 30}]


def _cluster():
    machines = {"a": Machine("a", GPUS, "tcp://127.0.0.1:1", joined=1.0),
                "b": Machine("b", GPUS, "tcp://127.0.0.1:2", joined=2.0),
                "gone": Machine("gone", GPUS, "tcp://127.0.0.1:3", joined=0.5, state="lost")}
    jobs = {"c1": CJob("c1", ["python", "t.py"], "/", state="running", machine="a", gpu=1, gpu_seconds=5.0,
                       attained=2.0, rate_now=50.0, rate_solo=100.0),
            "c2": CJob("c2", ["python", "t.py"], "/", state="suspended", machine="b", gpu=0),
            "c3": CJob("c3", ["python", "u.py"], "/"),
            "c4": CJob("c4", ["python", "u.py"], "/", state="done", machine="a", gpu=0)}
    return jobs, machines


class Scripted:
    name = "scripted"

    def __init__(self, actions):
        self.actions = actions
        self.seen = None

    def decide(self, snap, event):
        self.seen = snap
        return self.actions


def test_snapshot_from_tables():
    jobs, machines = _cluster()
    d = Driver(make_policy("gandiva"))
    snap = d.snapshot(jobs, machines, now=100.0)
    assert [m.gpu_ids for m in snap.machines] == [(0, 1), (2, 3)]          # lost machine left out, join order
    assert d.gpu_of == {0: ("a", 0), 1: ("a", 1), 2: ("b", 0), 3: ("b", 1)}
    assert set(snap.jobs) == {"c1", "c2", "c3"}                            # ended jobs leave the snapshot
    v = snap.jobs["c1"]
    assert v.state is JobState.RUNNING and v.gpus == (1,) and v.rate == 0.5 and v.attained == 7.0
    assert snap.jobs["c2"].state is JobState.SUSPENDED and snap.jobs["c3"].state is JobState.PENDING
    assert snap.gpu_units[1] == [("c1",)] and snap.total_idle == 3
    # when each started or stopped (gmux lets a suspended job wait a little again before it preempts)
    assert v.last_start == jobs["c1"].since and v.last_stop is None
    assert snap.jobs["c2"].last_stop == jobs["c2"].since and snap.jobs["c2"].last_start is None


def test_actions_become_intents():
    jobs, machines = _cluster()
    p = Scripted([Place("c3", (3,)), Pack("c3", "c1"), Suspend("c1"), Resume("c2", (2,)), Resume("c2", (1,)),
                  Migrate("c1", (0,)), Migrate("c1", (3,)), Unpack("c1"), Grow("c1", (0, 1)), SetTimer(5.0, "k"),
                  Place("c3", (0, 1))])
    intents, timers = Driver(p).decide(jobs, machines, Event(EventKind.TICK), now=1.0)
    got = [(i.what, i.cjob, i.machine, i.gpu) for i in intents]
    assert got == [("start", "c3", "b", 1), ("start", "c3", "a", 1), ("suspend", "c1", "a", 1),
                   ("resume", "c2", "b", 0), ("migrate", "c2", "a", 1), ("move", "c1", "a", 0),
                   ("migrate", "c1", "b", 1), ("none", "c1", None, None), ("none", "c1", None, None),
                   ("none", "c3", None, None)]
    assert timers == [(5.0, "k")]
    assert "on 2 GPUs, but c3 has 1 rank(s)" in intents[-1].why


def test_gangs_get_one_machine_and_their_gpus_to_themselves():
    jobs, machines = _cluster()
    jobs["g"] = CJob("g", ["python", "t.py"], "/", gpus=2)
    jobs["c5"] = CJob("c5", ["python", "u.py"], "/")
    jobs["c2"].state = "done"
    p = Scripted([Place("g", (1, 2)), Place("g", (0, 1)), Place("g", (2, 3)), Pack("c5", "c1")])
    intents, _ = Driver(p).decide(jobs, machines, Event(EventKind.TICK), now=1.0)
    assert [(i.what, i.machine, i.gpus) for i in intents] == [("none", None, ()), ("none", None, ()),
                                                              ("start", "b", (0, 1)), ("start", "a", (1,))]
    assert "across machines" in intents[0].why and "GPU 1 of a holds c1" in intents[1].why
    # Once the gang runs on b, nothing joins it there, and it moves between machines only.
    jobs["g"].state, jobs["g"].machine, jobs["g"].gpu, jobs["g"].rank_gpus = "running", "b", 0, [0, 1]
    p.actions = [Place("c5", (2,)), Migrate("g", (0, 1)), Migrate("g", (3, 2))]
    intents, _ = Driver(p).decide(jobs, machines, Event(EventKind.TICK), now=1.0)
    assert [i.what for i in intents] == ["none", "none", "none"]
    assert "a gang shares no GPU" in intents[0].why and "GPU 1 of a holds c1" in intents[1].why
    assert "between machines only" in intents[2].why
    snap = Driver(make_policy("gandiva")).snapshot(jobs, machines, now=1.0)
    assert snap.jobs["g"].gpus == (2, 3) and snap.jobs["g"].num_gpus == 2


def test_real_policies_place_pending_jobs():
    for name in ("gandiva", "gmux", "fifo", "tiresias"):
        jobs, machines = _cluster()
        intents, _ = Driver(make_policy(name)).decide(jobs, machines, Event(EventKind.ARRIVAL, job_id="c3"), 1.0)
        assert any(i.what == "start" and i.cjob == "c3" for i in intents), (name, intents)


def _two_sizes(busy_big: bool):
    """Machine `small` (two 8-GiB GPUs, joined first: a best fit picks it) and `big` (two 32-GiB GPUs)."""
    machines = {"small": Machine("small", GPUS, "tcp://127.0.0.1:1", joined=1.0),
                "big": Machine("big", [{"index": i, "mem_total": 32 << 30} for i in (0, 1)], "tcp://127.0.0.1:2",
                               joined=2.0)}
    jobs = {"runs": CJob("runs", ["python", "t.py"], "/", state="running", machine="small", gpu=0, mem=1 << 30),
            "wide": CJob("wide", ["python", "w.py"], "/", mem=12 << 30, gpus=2),
            "one": CJob("one", ["python", "w.py"], "/", mem=12 << 30)}
    if busy_big:
        jobs["hog"] = CJob("hog", ["python", "h.py"], "/", state="running", machine="big", gpu=0, rank_gpus=[0, 1],
                           gpus=2, mem=20 << 30)
    return jobs, machines


@pytest.mark.parametrize("name", ["fifo", "fifo-bf", "tiresias", "gandiva", "gmux"])
def test_no_policy_puts_a_job_on_gpus_smaller_than_its_memory(name):
    # It would fail there at every try and be held (an outside user's heterogeneous cluster: the 8-GiB machine
    # was the best fit by GPU count for a job of 12 GiB).
    for busy_big in (False, True):
        jobs, machines = _two_sizes(busy_big)
        driver = Driver(make_policy(name))
        intents = []
        for t, jid in enumerate(("one", "wide")):
            got, _ = driver.decide(jobs, machines, Event(EventKind.ARRIVAL, job_id=jid), float(t + 1))
            intents += got
        placed = {(i.cjob, i.machine) for i in intents if i.what in ("start", "resume", "migrate", "move")}
        assert all(m == "big" for jid, m in placed if jid in ("one", "wide")), (name, busy_big, intents)
        if not busy_big:
            assert {jid for jid, _ in placed} & {"one", "wide"}, (name, intents)     # the big machine is used


@pytest.mark.parametrize("name", ["fifo-bf", "tiresias", "gandiva", "gmux"])
def test_a_job_no_machine_up_can_hold_does_not_keep_a_smaller_one_waiting(name):
    # (the policies remembered a failed search by GPU count alone: one job of 12 GiB kept every 1-GPU job waiting)
    machines = {"small": Machine("small", GPUS, "tcp://127.0.0.1:1", joined=1.0)}
    jobs = {"huge": CJob("huge", ["python", "h.py"], "/", mem=12 << 30, submitted=1.0),
            "tiny": CJob("tiny", ["python", "t.py"], "/", mem=1 << 30, submitted=2.0)}
    intents, _ = Driver(make_policy(name)).decide(jobs, machines, Event(EventKind.ARRIVAL, job_id="tiny"), 3.0)
    assert [(i.what, i.cjob, i.machine) for i in intents] == [("start", "tiny", "small")], intents


def test_a_skipped_intent_is_logged_once_until_its_reason_changes(tmp_path):
    from gmux.wire import keys
    from gmux.cluster.scheduler.service import Options, Scheduler
    from gmux.cluster.scheduler.driver import Intent
    keydir = str(tmp_path / "keys")
    keys.create(keydir, "scheduler")
    s = Scheduler(str(tmp_path / "state"), keydir, Options(listen="tcp://127.0.0.1:*"))
    try:
        s.jobs["c1"] = CJob("c1", ["python", "t.py"], "/", state="starting", machine="a", gpu=0)
        skips = lambda: [d for d in s.recent if d["kind"] == "skip"]
        for _ in range(5):          # a policy proposing the same thing every tick
            s.intents.carry_out(Intent("none", "c1", why="gang c1 cannot share GPU 0"))
        assert len(skips()) == 1
        s.intents.carry_out(Intent("none", "c1", why="waiting for 2 free GPUs"))
        assert [d["text"] for d in skips()] == ["c1: gang c1 cannot share GPU 0", "c1: waiting for 2 free GPUs"]
    finally:
        s.close()


def test_a_checkpoint_set_older_than_the_one_held_is_dropped(tmp_path):
    # A move's source may send a periodic set taken before the move after the target's newer one: the job must
    # keep the newer (a restart from the older would lose progress), and the older's files go.
    from gmux.wire import keys
    from gmux.cluster.scheduler.service import Options, Scheduler
    keydir = str(tmp_path / "keys")
    keys.create(keydir, "scheduler")
    s = Scheduler(str(tmp_path / "state"), keydir, Options(listen="tcp://127.0.0.1:*"))
    try:
        s.jobs["c1"] = CJob("c1", ["python", "t.py"], "/", state="running", machine="b", gpu=0)

        def arrives(machine, seq, step):
            xfer = f"{machine}-c1-k{seq}.0"
            open(s.receiver.path(xfer), "wb").close()
            s._daemon_node_event(machine, b"", {"cjob": "c1", "event": "checkpointed",
                                                "data": {"xfers": [xfer], "step": step}}, None)
            return s.receiver.path(xfer)

        newer = arrives("b", 1, 500)
        older = arrives("a", 7, 420)
        assert s.jobs["c1"].ckpt_paths == [newer] and s.jobs["c1"].ckpt_step == 500
        assert os.path.exists(newer) and not os.path.exists(older)
        newest = arrives("b", 2, 600)
        assert s.jobs["c1"].ckpt_step == 600 and not os.path.exists(newer) and os.path.exists(newest)
    finally:
        s.close()


def test_a_policy_that_needs_durations_is_refused_before_anything_is_created(tmp_path, capsys):
    import pytest
    from gmux.cli import scheduler as cli
    from gmux.cluster.scheduler.service import Options, Scheduler
    from gmux.wire import keys
    keydir = str(tmp_path / "keys")
    keys.create(keydir, "scheduler")
    for name in ("sjf", "srtf", "gmux-law"):
        with pytest.raises(ValueError, match="needs every job's duration"):
            Driver(make_policy(name))
        state = tmp_path / f"state-{name}"
        with pytest.raises(ValueError, match="yardstick for gmux-sim"):
            Scheduler(str(state), keydir, Options(listen="tcp://127.0.0.1:*", policy=name))
        assert not state.exists()
        with pytest.raises(SystemExit) as e:
            cli.main(["--keys", keydir, "--state", str(state), "--policy", name])
        assert e.value.code == 2 and "invalid choice" in capsys.readouterr().err
        assert not state.exists()


@pytest.mark.parametrize("args,code,needle", [
    (["--params", "{nope"], 2, "--params is not JSON: Expecting property name"),
    (["--params", "[1]"], 2, "--params must be a JSON object ({...}), got list"),
    (["--params", "[" * 100000 + "]" * 100000], 2, "--params is not JSON gmux-scheduler reads: nested too deeply"),
    (["--params", '{"nope": 1}'], 2, "gmux: unknown parameter 'nope'; it takes base_gpu_s,"),
    (["--policy", "tiresias", "--params", '{"thresholds": [5, 1]}'], 2, "finite positive numbers in increasing order"),
    (["--params", '{"min_run_s": "\\u001b[31m"}'], 2, "'min_run_s' must be a finite number, got '\\x1b[31m'"),
    # taken, then every job's start (its checkpoint period, its lease) was refused by the machines' links
    (["--ckpt-every", "2e6"], 2, "--ckpt-every: 2e6 is not a number of seconds from 0 (never) to 1,000,000"),
    (["--lost-after", "2e6"], 2, "--lost-after: 2e6 is not a number of seconds > 0 and at most 1,000,000"),
    (["--admin", ""], 2, "--admin: key name '': use letters, digits")])
def test_bad_policy_parameters_are_refused_by_name_before_anything_is_created(tmp_path, capsys, args, code, needle):
    from gmux.cli import scheduler as cli
    from gmux.wire import keys
    keydir, state = str(tmp_path / "keys"), tmp_path / "state"
    keys.create(keydir, "scheduler")
    try:
        rc = cli.main(["--keys", keydir, "--state", str(state), *args])
    except SystemExit as e:
        rc = e.code
    err = capsys.readouterr().err
    assert rc == code and needle in err, err
    assert not state.exists()


def test_one_scheduler_per_state_directory_and_bad_addresses_are_refused_by_name(tmp_path, capsys):
    """Two schedulers on one --state each took the other's machines for silent; a bad or taken address ended in
    a ZeroMQ traceback."""
    import pytest
    from gmux.cli import scheduler as cli
    from gmux.cli.gmux import main as gmux_main
    from gmux.cluster.scheduler.service import Options, Scheduler
    from gmux.wire import keys
    keydir = str(tmp_path / "keys")
    keys.create(keydir, "scheduler")
    first = Scheduler(str(tmp_path / "state"), keydir, Options(listen="tcp://127.0.0.1:*"))
    try:
        with pytest.raises(OSError, match="another gmux-scheduler is running on"):
            Scheduler(str(tmp_path / "state"), keydir, Options(listen="tcp://127.0.0.1:*"))
        assert sorted(os.listdir(tmp_path / "state")) == ["checkpoints", "scheduler.db", "scheduler.db-shm",
                                                           "scheduler.db-wal", "scheduler.lock"]  # the first's, kept
        taken = first.endpoint
        # Each refusal leaves the state directory as it was: not made (nor its parents), or with nothing added.
        assert cli.main(["--keys", keydir, "--state", str(tmp_path / "new" / "state"), "--listen", taken]) == 1
        assert f"cannot listen on {taken}" in capsys.readouterr().err
        assert not (tmp_path / "new").exists()
        (tmp_path / "mine").mkdir()
        (tmp_path / "mine" / "notes.txt").write_text("the operator's")
        assert cli.main(["--keys", keydir, "--state", str(tmp_path / "mine"), "--listen", taken]) == 1
        assert cli.main(["--keys", str(tmp_path / "nokeys"), "--state", str(tmp_path / "mine")]) == 1
        assert "no key directory" in capsys.readouterr().err
        assert os.listdir(tmp_path / "mine") == ["notes.txt"]
        # A database that lost its contents (0 bytes: a crash, a full disk) is not taken for a new, empty cluster.
        (tmp_path / "mine" / "scheduler.db").write_bytes(b"")
        assert cli.main(["--keys", keydir, "--state", str(tmp_path / "mine"), "--listen", "tcp://127.0.0.1:*"]) == 1
        assert "scheduler.db is damaged or not a gmux-scheduler database (it is empty (0 bytes))" in \
            capsys.readouterr().err
        assert sorted(os.listdir(tmp_path / "mine")) == ["notes.txt", "scheduler.db"]
        assert (tmp_path / "mine" / "scheduler.db").read_bytes() == b""
    finally:
        first.close()
    Scheduler(str(tmp_path / "state"), keydir, Options(listen="tcp://127.0.0.1:*")).close()   # free once closed
    for bad in ("bogus", "tcp://127.0.0.1:\u0667\u0667\u0660\u0660"):    # (Arabic-Indic digits: int() reads them)
        with pytest.raises(SystemExit):
            cli.main(["--keys", keydir, "--state", str(tmp_path / "x"), "--listen", bad])
        assert f"{bad!r} is not tcp://HOST:PORT" in capsys.readouterr().err
    for bad in ("", "tcp://[::1", "tcp://::1:7700"):     # (an address with no host it can be: it waited 5 s)
        with pytest.raises(SystemExit):
            gmux_main(["ps", "--cluster", bad, "--keys", keydir])
        assert f"{bad!r} is not tcp://HOST:PORT" in capsys.readouterr().err
    with pytest.raises(SystemExit):     # (the scheduler refused it as a wire field: c_submit.ckpt_every)
        gmux_main(["submit", "--cluster", "tcp://127.0.0.1:9", "--keys", keydir, "--ckpt-every", "2e6", "--",
                   "python", "x.py"])
    assert "--ckpt-every: 2e6 is not a number of seconds from 0 (never) to 1,000,000" in capsys.readouterr().err
    for command, said in ((["submit", "--ranks", "65", "--", "python", "x.py"], "--ranks: 65 is not a number of "
                           "ranks from 1 to 64"), (["migrate", "c1", "--machine", "m1", "--gpu", "5000"],
                                                   "--gpu: 5000 is not a GPU index from 0 to 4096")):
        with pytest.raises(SystemExit):
            gmux_main([command[0], "--cluster", "tcp://127.0.0.1:9", "--keys", keydir, *command[1:]])
        assert said in capsys.readouterr().err
    # A damaged state database: named, left as it is (it was a traceback)
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "scheduler.db").write_bytes(b"\x00garbage" * 500)
    assert cli.main(["--keys", keydir, "--state", str(tmp_path / "bad"), "--listen", "tcp://127.0.0.1:*"]) == 1
    assert "scheduler.db is damaged or not a gmux-scheduler database" in capsys.readouterr().err
    assert (tmp_path / "bad" / "scheduler.db").read_bytes() == b"\x00garbage" * 500
    # A command that is not a Python script is refused before it reaches a scheduler (it started on a machine,
    # failed in its log, and stayed "starting")
    keys.create(keydir, "client", "tester")
    assert gmux_main(["submit", "--cluster", "tcp://127.0.0.1:9", "--keys", keydir, "--as", "tester", "--",
                      "sleep", "100"]) == 1
    assert "submit: a job is a Python training script" in capsys.readouterr().err


def test_keys_refused_for_one_bad_or_repeated_name_makes_none(tmp_path, capsys):
    from gmux.cli.gmux import main as gmux_main
    keydir = tmp_path / "k"
    for args in (["--daemon", "good", "--daemon", "\x1b[31mbad"], ["--client", "a", "--client", "a"]):
        with pytest.raises(SystemExit) as e:    # (the command line's slips: usage errors)
            gmux_main(["keys", "--dir", str(keydir), *args])
        assert e.value.code == 2
    err = capsys.readouterr().err
    assert "key name '\\x1b[31mbad'" in err and "--client a given twice" in err
    assert not keydir.exists() or not os.listdir(keydir)
    assert gmux_main(["keys", "--dir", str(keydir), "--client", "a", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"created": [{"public": str(keydir / "client.a.pub"),
                                                                "secret": str(keydir / "client.a.secret")}]}
    assert gmux_main(["keys", "--dir", str(keydir), "--client", "b", "--client", "a"]) == 1
    assert sorted(os.listdir(keydir)) == ["client.a.pub", "client.a.secret"]


def test_keys_in_a_directory_others_can_write_or_that_cannot_be_made_are_refused_and_nothing_changes(tmp_path,
                                                                                                   capsys):
    """Whoever can add a .pub file to the key directory is let in: one that others can write is refused, and its
    mode is left as it was (it was chmodded to 0700: `--dir /tmp` took /tmp from everyone)."""
    from gmux.cli.gmux import main as gmux_main
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    assert gmux_main(["keys", "--dir", str(shared), "--client", "a"]) == 1
    assert f"{shared} can be written by others (mode 0o777)" in capsys.readouterr().err
    assert os.stat(shared).st_mode & 0o7777 == 0o1777 and os.listdir(shared) == []
    (tmp_path / "file").write_text("")
    assert gmux_main(["keys", "--dir", str(tmp_path / "file" / "k"), "--client", "a"]) == 1
    err = capsys.readouterr().err
    assert f"cannot make the key directory {tmp_path / 'file' / 'k'}: Not a directory" in err, err
    own = tmp_path / "own"
    assert gmux_main(["keys", "--dir", str(own), "--client", "a", "--scheduler"]) == 0
    assert os.stat(own).st_mode & 0o777 == 0o700
    # gmux-scheduler refuses such a directory as its --keys too (it trusts every .pub file there).
    from gmux.cli import scheduler as cli
    own.chmod(0o777)
    assert cli.main(["--keys", str(own), "--state", str(tmp_path / "st"), "--listen", "tcp://127.0.0.1:*"]) == 1
    assert f"{own} can be written by others (mode 0o777)" in capsys.readouterr().err
    assert not (tmp_path / "st").exists()


def test_a_suspended_gang_gives_its_gpus_back_and_takes_them_back_once_they_are_free():
    jobs, machines = _cluster()
    machines["w"] = Machine("w", GPUS + [{"index": 2, "mem_total": 8 << 30}], "tcp://127.0.0.1:4", joined=3.0)
    jobs["g"] = CJob("g", ["python", "t.py"], "/", gpus=2, state="running", machine="w", gpu=0, rank_gpus=[0, 1])
    jobs["c5"] = CJob("c5", ["python", "u.py"], "/")
    p = Scripted([Suspend("g"), Place("c5", (4,))])         # global 4 = w's GPU 0
    d = Driver(p)
    intents, _ = d.decide(jobs, machines, Event(EventKind.TICK), now=1.0)
    assert [i.what for i in intents] == ["suspend", "none"]      # g still runs there until its suspend lands
    # Suspended, the gang is parked by gmuxd: its GPUs take others (before: refused at every decision, so the
    # gang stayed suspended and the job it was suspended for never ran).
    jobs["g"].state = "suspended"
    p.actions = [Place("c5", (4,))]
    intents, _ = d.decide(jobs, machines, Event(EventKind.TICK), now=2.0)
    assert [(i.what, i.machine, i.gpus) for i in intents] == [("start", "w", (0,))]
    jobs["c5"].state, jobs["c5"].machine, jobs["c5"].gpu, jobs["c5"].rank_gpus = "running", "w", 0, [0]
    # Running, c5 keeps the gang off GPU 0; nor may anything join the gang's GPUs in the decision it resumes.
    p.actions = [Resume("g", (4, 5)), Place("c3", (5,))]
    intents, _ = d.decide(jobs, machines, Event(EventKind.TICK), now=3.0)
    assert [i.what for i in intents] == ["none", "start"] and "GPU 0 of w holds c5" in intents[0].why
    # Suspended, c5 is no obstacle: gmuxd gives its GPU to the gang (parks it) as the gang comes back.
    jobs["c5"].state = "suspended"
    p.actions = [Resume("g", (4, 5)), Place("c3", (6,))]
    intents, _ = d.decide(jobs, machines, Event(EventKind.TICK), now=4.0)
    assert [(i.what, i.cjob, i.machine, i.gpus) for i in intents] == [("resume", "g", "w", (0, 1)),
                                                                     ("start", "c3", "w", (2,))]
    # c5 resumed in the same decision is no longer waiting: the gang does not take its GPU, and waits.
    p.actions = [Resume("c5", (4,)), Resume("g", (4, 5))]
    intents, _ = d.decide(jobs, machines, Event(EventKind.TICK), now=5.0)
    assert [i.what for i in intents] == ["resume", "none"] and "holds c5" in intents[1].why
    # Parked (its machine says so), c5 resumes on its own GPU once the gang lets it go, or on another machine,
    # not on another GPU of w: its process waits on GPU 0.
    jobs["g"].state, jobs["c5"].parked = "running", True
    p.actions = [Resume("c5", (6,)), Resume("c5", (4,)), Resume("c5", (0,))]
    intents, _ = d.decide(jobs, machines, Event(EventKind.TICK), now=7.0)
    assert [(i.what, i.machine) for i in intents] == [("none", None), ("none", None), ("migrate", "a")]
    assert "c5 gave GPU 0 of w to another job while suspended: it resumes there once it is free" in intents[0].why
    assert "GPU 0 of w holds g; a gang shares no GPU" in intents[1].why
    # Once the gang has let its GPU go, a resume onto another GPU of w resumes it on its own (where its process
    # waits; before, the scheduler counted it on the GPU asked while it ran on its own).
    jobs["g"].state = "suspended"
    p.actions = [Resume("c5", (6,))]
    intents, _ = d.decide(jobs, machines, Event(EventKind.TICK), now=7.5)
    assert [(i.what, i.gpus) for i in intents] == [("resume", (0,))] and "gave back while suspended" in intents[0].why
    # (found in review) Parked, then held by its user, the gang keeps its GPUs from the policy, but not the one
    # c5 sits on, suspended since: c5 may resume there (before: hidden, and refused, until the gang's release).
    jobs["g"].state, jobs["g"].parked, jobs["c5"].parked = "held", True, False
    p.actions = [Resume("c5", (4,))]
    intents, _ = d.decide(jobs, machines, Event(EventKind.TICK), now=8.0)
    assert [(i.what, i.gpus) for i in intents] == [("resume", (0,))]
    assert 4 in p.seen.machines[2].gpu_ids and 5 not in p.seen.machines[2].gpu_ids


def test_the_schedulers_help_shows_every_default():
    """--listen's default, where the scheduler listens unless told, was not in its --help, nor --ckpt-every's."""
    import argparse
    from gmux.cli import scheduler as cli
    p = cli.build_parser()
    formatter = p._get_formatter()
    for action in p._actions:
        if action.default in (None, False, [], argparse.SUPPRESS):
            continue
        said = formatter._expand_help(action)
        shown = {str(action.default)} | ({format(action.default, "g")} if isinstance(action.default, float) else set())
        assert "default" in said and any(s in said for s in shown), (action.option_strings, said)
