"""A machine cut off from its scheduler while its gmuxd lives (a network partition) suspends its cluster jobs once
unanswered for their lease, before the scheduler counts it lost and starts them elsewhere: the job never trains
in two places. When the machine is heard again, the copy there is killed and the job ends bit-identical from
the copy elsewhere; a scheduler that was only away (its process stopped, restarted) resumes the suspended jobs at
once and nothing restarts."""
import json
import signal
import time

import pytest

from cluster_harness import Solo, wait_for
from gmux import protocol
from gmux.node.cluster_fence import Fence
from gmux.wire.daemon_client import Client
from test_unheard import sched  # noqa: F401 (a fixture: a scheduler without daemons, whose sends are recorded)

C = protocol.CLUSTER_MESSAGES
STEPS = "3000"
ARGS = (STEPS, "--batch", "37", "--sleep", "0.004")


def _rec(state="running", held=False):
    return {"cjob": "c", "local": "j1", "state": state, "step": 5, "gpu": 0, "held": held}


def test_the_fence_suspends_only_once_unanswered_for_the_lease_and_only_what_still_trains():
    f = Fence(now=0.0)
    jobs = {"run": _rec(), "held": _rec(held=True), "done": _rec("exited"), "moving": _rec("migrating"),
            "sliced": _rec("suspended")}
    assert f.due(100.0, jobs) == []                           # never answered: no lease, nothing to vouch for
    for bad in (None, {}, {"lease_s": -1}, {"lease_s": "2"}, {"lease_s": True}, {"lease_s": 2.0, "x": 1}, [2.0]):
        f.heard(bad, 50.0)
        assert f.lease_s is None and f.heard_at == 0.0, bad   # a malformed answer does not count as heard
    f.heard({"lease_s": 2.0}, 10.0)
    assert f.due(12.0, jobs) == [] and not f.cut_off(12.0)
    # Past the lease: what trains, or what gmuxd's slicer may resume, is suspended; not twice at once.
    assert f.due(12.1, jobs) == ["run", "sliced"] and f.fenced == set()
    assert f.due(12.6, jobs) == []
    f.done("run", ok=True)
    f.done("sliced", ok=False)                                # refused: tried again at the next look
    assert f.fenced == {"run"} and f.due(13.0, jobs) == ["run", "sliced"]   # (its record: still not held)
    jobs["run"]["held"] = True
    f.done("run", ok=True)
    f.done("sliced", ok=True)
    assert f.due(13.5, jobs) == ["sliced"] and f.cut_off(13.5)
    f.heard({"lease_s": 2.0}, 14.0)                           # answered again: the scheduler decides now
    assert not f.cut_off(14.5) and f.due(14.5, jobs) == [] and f.fenced == {"run", "sliced"}
    f.acted_on("run")
    assert f.fenced == {"sliced"}


def test_a_fenced_job_travels_in_the_report_and_nothing_else_does():
    report = {"name": "m1", "gpus": [{"index": 0, "mem_total": 1}], "transfer": "tcp://127.0.0.1:1",
              "jobs": [{**_rec(held=True), "fenced": True}]}
    assert protocol.decode(protocol.encode("node_report", 0, table=C, **report), C)["jobs"][0]["fenced"] is True
    report["jobs"][0]["fenced"] = "yes"
    with pytest.raises(protocol.ProtocolError, match="fenced"):
        protocol.decode(protocol.encode("node_report", 0, table=C, **report), C)


def _report(s, held, fenced):
    return s._daemon_node_report("m1", b"m1", {"name": "m1", "gpus": s.machines["m1"].gpus,
                                                "transfer": "tcp://127.0.0.1:1",
                                                "jobs": [{**_rec(held=held), "cjob": "c1", "fenced": fenced}]}, None)


def test_the_scheduler_answers_each_report_with_the_lease_and_resumes_a_fenced_job_at_once(sched):
    assert _report(sched, held=False, fenced=False) == {"lease_s": pytest.approx(0.8 * sched.opt.lost_after)}
    # Held by its user on the machine (a local `gmux suspend`): resumed only after the grace.
    _report(sched, held=True, fenced=False)
    assert sched.wire == []
    # Suspended by its link while cut off: resumed by the first report that shows it, not again right after.
    _report(sched, held=True, fenced=True)
    assert [w[1] for w in sched.wire] == ["resume"]
    _report(sched, held=True, fenced=True)
    assert [w[1] for w in sched.wire] == ["resume"]


def _local(tmp_path, machine, cjob, every=False):
    jobs = Client(str(tmp_path / f"rt-{machine}")).call("ps", all=every)["jobs"]
    return next((j for j in jobs if j["name"] == cjob), None)


def _running_with_checkpoint(c, cjob):
    return wait_for(lambda: (lambda j: j["state"] == "running" and (j["ckpt_step"] or 0) > 100 and j)(c.job(cjob)),
                    90, "the job running, with a checkpoint")


def test_a_machine_cut_off_stops_training_before_its_job_restarts_elsewhere(cluster_factory, tmp_path):
    c = cluster_factory(policy="gandiva", machines=("m1", "m2"), sched_args=("--lost-after", "3"), proxied=True)
    ref = Solo(tmp_path, "ref", *ARGS)
    c.wait_machines(2)
    out = tmp_path / "out.json"
    cjob = c.submit(str(out), *ARGS, ckpt_every=1.0)
    src = _running_with_checkpoint(c, cjob)["machine"]
    c.proxies[src].sever()
    cut_at = time.monotonic()
    fenced = wait_for(lambda: (lambda j: j and j["held"] and j)(_local(tmp_path, src, cjob)), 20,
                      "the job suspended on the machine cut off")
    assert time.monotonic() - cut_at < 6.0          # its lease (2.4 s), a report's period and a boundary
    again = wait_for(lambda: (lambda j: j["restarts"] == 1 and j["state"] in ("running", "done") and j)(c.job(cjob)),
                     60, "restarted on the other machine")
    assert again["machine"] != src
    # The copy cut off does not train while the other one does.
    step = _local(tmp_path, src, cjob)["step"]
    time.sleep(1.5)
    assert _local(tmp_path, src, cjob)["step"] == step and step <= fenced["step"] + 1
    assert "no answer from the scheduler" in (tmp_path / f"gmuxd-{src}.log").read_text()
    c.proxies[src].heal()                            # heard again: its copy there is killed
    gone = wait_for(lambda: (lambda j: j and j["state"] in protocol.FINAL_STATES and j)(
        _local(tmp_path, src, cjob, every=True)), 30, "the copy on the machine cut off killed")
    assert gone["step"] == step
    jobs = c.wait_done([cjob], 240)
    assert jobs[cjob]["restarts"] == 1
    res = json.loads(out.read_text())
    assert res["sha256"] == ref["sha256"] and res["steps"] == int(STEPS)


def test_a_scheduler_away_for_longer_than_the_lease_costs_its_jobs_a_pause_not_a_restart(cluster_factory, tmp_path):
    c = cluster_factory(policy="gandiva", machines=("m1",), sched_args=("--lost-after", "3"))
    ref = Solo(tmp_path, "ref", *ARGS)
    c.wait_machines(1)
    out = tmp_path / "out.json"
    cjob = c.submit(str(out), *ARGS, ckpt_every=1.0)
    _running_with_checkpoint(c, cjob)
    c.sched.send_signal(signal.SIGSTOP)
    try:
        wait_for(lambda: (lambda j: j and j["held"])(_local(tmp_path, "m1", cjob)), 20, "the job suspended")
        step = _local(tmp_path, "m1", cjob)["step"]
        time.sleep(1.0)
        assert _local(tmp_path, "m1", cjob)["step"] == step
    finally:
        c.sched.send_signal(signal.SIGCONT)
    back = time.monotonic()
    wait_for(lambda: (lambda j: j and not j["held"] and j["step"] > step)(_local(tmp_path, "m1", cjob)), 30,
             "the job resumed")
    assert time.monotonic() - back < 8.0                 # at once, not after the grace of a lost action (10 s)
    jobs = c.wait_done([cjob], 240)
    assert jobs[cjob]["restarts"] == 0
    res = json.loads(out.read_text())
    assert res["sha256"] == ref["sha256"] and res["steps"] == int(STEPS)
