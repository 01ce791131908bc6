"""A machine cut off from its scheduler while its gmuxd lives (a network partition) suspends its cluster jobs once
unanswered for its fence time, before the scheduler counts it lost and starts them elsewhere: the job never trains
in two places. When the machine is heard again, the copy there is killed and the job ends bit-identical from
the copy elsewhere; a scheduler that was only away (its process stopped, restarted) resumes the suspended jobs at
once and nothing restarts."""
import json
import re
import signal
import time
from datetime import datetime

import pytest

from cluster_harness import Solo, paced, unpace, wait_for
from gmux import protocol
from gmux.node.cluster_fence import Fence
from gmux.wire.daemon_client import Client
from test_unheard import sched  # noqa: F401 (a fixture: a scheduler without daemons, whose sends are recorded)

C = protocol.CLUSTER_MESSAGES
STEPS = "3000"
ARGS = (STEPS, "--batch", "37")


def _rec(state="running", held=False):
    return {"cjob": "c", "local": "j1", "state": state, "step": 5, "gpu": 0, "held": held}


def test_the_fence_suspends_only_once_unanswered_and_only_what_still_trains(tmp_path):
    kept = str(tmp_path / "cluster-fence")
    f = Fence(0.0, kept)
    jobs = {"run": _rec(), "held": _rec(held=True), "done": _rec("exited"), "moving": _rec("migrating"),
            "sliced": _rec("suspended")}
    assert f.due(100.0, jobs) == []                           # never answered: no fence time, nothing to vouch for
    for bad in (None, {}, {"fence_s": -1}, {"fence_s": "2"}, {"fence_s": True}, {"fence_s": 1e300}, [2.0]):
        f.heard(bad, 50.0)
        assert f.fence_s is None and f.heard_at == 0.0, bad   # a malformed answer does not count as heard
    assert f.stop_within() == {}                               # (gmuxd's own deadline, then)
    f.heard({"fence_s": 2.0, "later": "a field a later scheduler adds"}, 10.0)
    # Its suspend stops a job not suspended within a third of the fence time, whatever its mini-batch: 8-s steps
    # had a deadline of 24 s, and trained on beside the copy the scheduler started elsewhere.
    assert f.stop_within() == {"deadline_s": pytest.approx(2.0 / 3)}
    assert f.due(12.0, jobs) == [] and not f.cut_off(12.0) and not f.refuses("resume", 12.0)
    # Past it: what trains, or what gmuxd's slicer may resume, is suspended; not twice at once.
    assert f.due(12.1, jobs) == ["run", "sliced"] and f.fenced == set()
    assert f.due(12.6, jobs) == []
    f.done("run", None)
    f.done("sliced", RuntimeError("refused"))                 # tried again at the next look
    assert f.fenced == {"run"} and f.due(13.0, jobs) == ["run", "sliced"]   # ("run"'s record: not held yet)
    jobs["run"]["held"] = True
    f.done("run", None)
    f.done("sliced", None)
    assert f.due(13.5, jobs) == ["sliced"]
    # Cut off, an action that would set a job training is stale; one that stops it is carried out.
    assert [a for a in protocol.CLUSTER_ACTIONS if f.refuses(a, 13.5)] == ["start", "resume", "move", "migrate_out"]
    # A gmuxd restarted while cut off fences what it finds.
    g = Fence(20.0, kept)
    assert g.fence_s == 2.0 and g.due(22.5, jobs) == ["sliced"]
    f.heard({"fence_s": 2.0}, 14.0)                           # answered again: the scheduler decides now
    assert not f.cut_off(14.5) and f.due(14.5, jobs) == [] and f.fenced == {"run", "sliced"}
    f.acted_on("run", "suspend")                              # (still waiting for its resume)
    f.acted_on("sliced", "resume")
    assert f.fenced == {"run"} and not f.refuses("resume", 14.5)
    f.forget("run")                                           # ended
    assert f.fenced == set()


def test_a_fenced_job_travels_in_the_report_and_nothing_else_does():
    report = {"name": "m1", "gpus": [{"index": 0, "mem_total": 1}], "transfer": "tcp://127.0.0.1:1",
              "jobs": [{**_rec(held=True), "fenced": True}]}
    assert protocol.decode(protocol.encode("node_report", 0, table=C, **report), C)["jobs"][0]["fenced"] is True
    report["jobs"][0]["fenced"] = "yes"
    with pytest.raises(protocol.ProtocolError, match="fenced"):
        protocol.decode(protocol.encode("node_report", 0, table=C, **report), C)


def _report(s, held, fenced, state="running", machine="m1"):
    return s._daemon_node_report(machine, machine.encode(), {
        "name": machine, "gpus": s.machines[machine].gpus, "transfer": "tcp://127.0.0.1:1",
        "jobs": [{**_rec(state, held=held), "cjob": "c1", "fenced": fenced}]}, None)


def test_the_scheduler_answers_each_report_and_resumes_a_fenced_job_once_its_answer_is_heard(sched):
    assert _report(sched, held=False, fenced=False) == {"fence_s": pytest.approx(0.6 * sched.opt.lost_after)}
    # Suspended by its link while cut off: the first report that shows it is answered first (a resume sent with
    # it would reach a link still cut off); the next one's resume goes out at once, not after the grace.
    _report(sched, held=True, fenced=True)
    assert sched.wire == []
    time.sleep(0.01)
    _report(sched, held=True, fenced=True)
    assert [w[1] for w in sched.wire] == ["resume"]
    _report(sched, held=True, fenced=True)
    assert [w[1] for w in sched.wire] == ["resume"]           # not again while it is on its way


def test_a_start_fenced_before_its_first_step_is_resumed_too(sched):
    sched.jobs["c1"].state = "starting"
    _report(sched, held=True, fenced=True, state="suspended")
    time.sleep(0.01)
    _report(sched, held=True, fenced=True, state="suspended")
    assert [w[1] for w in sched.wire] == ["resume"]


def test_a_fenced_copy_of_a_job_that_ended_elsewhere_is_killed(sched):
    from gmux.cluster.scheduler.state import Machine
    sched.machines["m2"] = Machine("m2", [{"index": 0, "mem_total": 1 << 30}], "tcp://127.0.0.1:2",
                                   last_seen=time.time())
    job = sched.jobs["c1"]
    job.machine, job.state = "m1", "done"                     # it ran on elsewhere and finished
    _report(sched, held=True, fenced=True, machine="m2")
    assert sched.wire == [("m2", "kill", {})]


def _local(tmp_path, machine, cjob, every=False):
    jobs = Client(str(tmp_path / f"rt-{machine}")).call("ps", all=every)["jobs"]
    return next((j for j in jobs if j["name"] == cjob), None)


def _running_with_checkpoint(c, cjob):
    return wait_for(lambda: (lambda j: j["state"] == "running" and (j["ckpt_step"] or 0) > 100 and j)(c.job(cjob)),
                    90, "the job running, with a checkpoint")


def test_a_machine_cut_off_stops_training_before_its_job_restarts_elsewhere(cluster_factory, tmp_path):
    # (lost after 5 s: the fence at 3 s leaves 2 s for it to take effect before the scheduler acts, on a loaded
    # machine too)
    c = cluster_factory(policy="gandiva", machines=("m1", "m2"), sched_args=("--lost-after", "5"), proxied=True)
    ref = Solo(tmp_path, "ref", *ARGS, *paced(tmp_path, "0.004"))
    c.wait_machines(2)
    out = tmp_path / "out.json"
    cjob = c.submit(str(out), *ARGS, *paced(tmp_path, "0.004"), ckpt_every=1.0)
    src = _running_with_checkpoint(c, cjob)["machine"]
    c.proxies[src].sever()
    cut_at = time.time()
    # The copy cut off stops training (gmuxd's ps, every 50 ms: when its step last moved) ...
    samples = []
    while time.time() - cut_at < 20 and not (len(samples) > 20 and samples[-1][1]["held"]
                                             and samples[-20][1]["step"] == samples[-1][1]["step"]):
        samples.append((time.time(), _local(tmp_path, src, cjob)))
        time.sleep(0.05)
    step = samples[-1][1]["step"]
    stopped_at = next(t for t, j in samples if j["step"] == step)
    assert samples[-1][1]["held"] and stopped_at - cut_at < 5.0     # its fence time (3 s) and a boundary
    again = wait_for(lambda: (lambda j: j["restarts"] == 1 and j["state"] in ("running", "done") and j)(c.job(cjob)),
                     60, "restarted on the other machine")
    assert again["machine"] != src
    # ... before its copy elsewhere was started, and stays stopped.
    started = re.search(r"^(\S+ \S+) gmuxd INFO started " + cjob, (tmp_path / f"gmuxd-{again['machine']}.log")
                        .read_text(), re.M)
    assert stopped_at < datetime.strptime(started.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
    time.sleep(1.0)
    assert _local(tmp_path, src, cjob)["step"] == step
    assert "no answer from the scheduler" in (tmp_path / f"gmuxd-{src}.log").read_text()
    c.proxies[src].heal()                            # heard again: its copy there is killed
    gone = wait_for(lambda: (lambda j: j and j["state"] in protocol.FINAL_STATES and j)(
        _local(tmp_path, src, cjob, every=True)), 30, "the copy on the machine cut off killed")
    assert gone["step"] == step
    unpace(tmp_path)
    jobs = c.wait_done([cjob], 240)
    assert jobs[cjob]["restarts"] == 1
    res = json.loads(out.read_text())
    assert res["sha256"] == ref["sha256"] and res["steps"] == int(STEPS)


def test_a_scheduler_away_for_longer_than_the_fence_time_costs_its_jobs_a_pause_not_a_restart(cluster_factory, tmp_path):
    c = cluster_factory(policy="gandiva", machines=("m1",), sched_args=("--lost-after", "3"))
    ref = Solo(tmp_path, "ref", *ARGS, *paced(tmp_path, "0.004"))
    c.wait_machines(1)
    out = tmp_path / "out.json"
    cjob = c.submit(str(out), *ARGS, *paced(tmp_path, "0.004"), ckpt_every=1.0)
    _running_with_checkpoint(c, cjob)
    c.sched.send_signal(signal.SIGSTOP)
    try:
        wait_for(lambda: (lambda j: j and j["held"])(_local(tmp_path, "m1", cjob)), 20, "the job suspended")
        # (its last steps' report may reach gmuxd after the hold shows: CI once read a step 13 short)
        seen = []
        step = wait_for(lambda: seen.append(_local(tmp_path, "m1", cjob)["step"]) or
                        (len(seen) > 5 and seen[-1] == seen[-6] and seen[-1]), 20, lambda: f"the job stopped: {seen}",
                        every=0.1)
        time.sleep(1.0)
        assert _local(tmp_path, "m1", cjob)["step"] == step
    finally:
        c.sched.send_signal(signal.SIGCONT)
    back = time.monotonic()
    wait_for(lambda: (lambda j: j and not j["held"] and j["step"] > step)(_local(tmp_path, "m1", cjob)), 30,
             "the job resumed")
    assert time.monotonic() - back < 8.0                 # at once, not after the grace of a lost action (10 s)
    unpace(tmp_path)
    jobs = c.wait_done([cjob], 240)
    assert jobs[cjob]["restarts"] == 0
    res = json.loads(out.read_text())
    assert res["sha256"] == ref["sha256"] and res["steps"] == int(STEPS)
