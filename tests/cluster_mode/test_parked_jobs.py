"""Jobs whose gmuxd gave their GPUs to others while they were suspended ("parked"), as the scheduler sees them:
a failed move leaves a suspended job suspended where it was, a resumed job still waiting for its GPUs is no pack
partner, and a user's hold on a parked job keeps nothing from a gang parked on the same GPUs."""
import time

from gmux.cluster.policies import Event, EventKind, Pack, Place
from gmux.cluster.scheduler.driver import Driver, Intent
from gmux.cluster.scheduler.state import CJob, Machine
from gmux.node.cluster_records import gang_record
from test_driver import Scripted
from test_unheard import GRACE, sched  # noqa: F401 (the fixture)

G2 = [{"index": 0, "mem_total": 1 << 30}, {"index": 1, "mem_total": 1 << 30}]


def _report(s, name, recs):
    s._daemon_node_report(name, name.encode(), {"name": name, "gpus": G2, "transfer": "tcp://127.0.0.1:1",
                                                "jobs": recs}, None)


def _parked_gang(s) -> CJob:
    """Gang g on m1's GPUs 0 and 1, suspended by the policy and parked by gmuxd; m1 and m2 have two GPUs."""
    s.machines["m1"].gpus = G2
    s.machines["m2"] = Machine("m2", G2, "tcp://127.0.0.1:2", last_seen=time.time())
    s.jobs["g"] = CJob("g", ["python", "t.py"], "/", gpus=2, state="suspended", machine="m1", gpu=0,
                       rank_gpus=[0, 1], local="j5", parked=True, step=50)
    return s.jobs["g"]


def test_a_parked_gang_whose_move_fails_stays_suspended_where_it_was(sched):
    s = sched
    # c1 started on GPU 0 since g was parked. The policy resumes g on m2, a migration, whose target fails as
    # it warms.
    g = _parked_gang(s)
    s.intents.carry_out(Intent("migrate", "g", "m2", 0, "policy Resume", (0, 1)))
    assert g.state == "migrating" and not g.parked
    s._daemon_node_event("m2", b"m2", {"name": "m2", "cjob": "g", "event": "start_failed",
                                       "detail": "no GPU", "data": {}}, None)
    # (before: counted running on GPUs 0 and 1 beside c1, and resumed there by Unheard, to wait behind c1)
    assert (g.state, g.machine, g.rank_gpus) == ("suspended", "m1", [0, 1]), (g.state, g.detail)
    rec = {"cjob": "g", "local": "j5", "state": "held", "step": 50, "gpu": None, "held": True, "parked_gpu": 0}
    time.sleep(GRACE * 1.5)
    for _ in range(2):
        _report(s, "m1", [rec, {"cjob": "c1", "local": "j1", "state": "running", "step": 10, "gpu": 0,
                                "held": False}])
    assert g.parked and not [w for w in s.wire if w[1] == "resume"], s.wire


def test_a_resumed_gang_still_waiting_for_its_parked_gpus_is_no_pack_partner():
    # Resumed on GPUs 0 and 1 of w, its ranks still wait there (its reports still say parked): it is counted
    # where it goes, and nothing is packed beside it.
    machines = {"w": Machine("w", G2, "tcp://127.0.0.1:4", joined=1.0)}
    jobs = {"g": CJob("g", ["python", "t.py"], "/", gpus=2, state="running", machine="w", gpu=0, rank_gpus=[0, 1],
                      parked=True),
            "h": CJob("h", ["python", "t.py"], "/", gpus=2)}
    intents, _ = Driver(Scripted([Pack("h", "g")])).decide(jobs, machines, Event(EventKind.TICK), now=1.0)
    assert [i.what for i in intents] == ["none"] and "a gang shares no GPU" in intents[0].why


def test_a_held_parked_job_keeps_nothing_from_a_gang_parked_on_the_same_gpus():
    # c5 was parked for gang g; then g was suspended (parked too) and c5's user held c5. g resumes only on
    # GPUs 0 and 1 of w: the policy is shown both (before: GPU 0 was kept for c5's hold, nobody on it).
    machines = {"w": Machine("w", G2, "tcp://127.0.0.1:4", joined=1.0)}
    jobs = {"c5": CJob("c5", ["python", "u.py"], "/", state="held", machine="w", gpu=0, rank_gpus=[0], parked=True),
            "g": CJob("g", ["python", "t.py"], "/", gpus=2, state="suspended", machine="w", gpu=0, rank_gpus=[0, 1],
                      parked=True)}
    p = Scripted([])
    Driver(p).decide(jobs, machines, Event(EventKind.TICK), now=1.0)
    assert p.seen.machines[0].gpu_ids == (0, 1)


def test_a_gang_does_not_go_where_a_suspended_job_that_reaches_no_boundary_waits():
    # A job with no boundary never suspends (gmuxd stops it, its memory kept on the GPU), so it is never parked:
    # a gang sent onto its GPU would wait for good.
    machines = {"w": Machine("w", G2, "tcp://127.0.0.1:4", joined=1.0)}
    jobs = {"c5": CJob("c5", ["python", "u.py"], "/", state="suspended", machine="w", gpu=0, rank_gpus=[0],
                       boundless=True),
            "g": CJob("g", ["python", "t.py"], "/", gpus=2)}
    p = Scripted([Place("g", (0, 1))])
    intents, _ = Driver(p).decide(jobs, machines, Event(EventKind.TICK), now=1.0)
    assert [i.what for i in intents] == ["none"] and "GPU 0 of w holds c5" in intents[0].why
    jobs["c5"].boundless = False
    intents, _ = Driver(p).decide(jobs, machines, Event(EventKind.TICK), now=2.0)
    assert [(i.what, i.gpus) for i in intents] == [("start", (0, 1))]


def test_a_suspended_job_that_never_reached_a_boundary_stays_boundless_in_its_reports(sched):
    # (found in review) c5 never reached a boundary; the policy suspended it and gmuxd stopped it (SIGSTOP) at
    # its deadline, held. Its machine's record of it, as the link builds it, says so: the scheduler still counts
    # it boundless and sends no gang onto its GPU (gmuxd can never park it there). Before, the record said it was
    # no longer boundless once it stopped running.
    s = sched
    s.machines["m1"].gpus = G2
    s.jobs = {"c5": CJob("c5", ["python", "u.py"], "/", state="suspended", machine="m1", gpu=0, rank_gpus=[0],
                         local="j1", boundless=True),
              "g": CJob("g", ["python", "t.py"], "/", gpus=2)}
    rec = gang_record("c5", 1, {0: {"id": "j1", "state": "stopped", "started": False, "gpu": 0, "held": True,
                                    "step": 0}})
    rec.pop("_broken")
    _report(s, "m1", [rec])
    intents, _ = Driver(Scripted([Place("g", (0, 1))])).decide(s.jobs, s.machines, Event(EventKind.TICK), now=1.0)
    assert [i.what for i in intents] == ["none"], intents


def test_the_source_of_a_suspended_jobs_move_is_told_not_to_resume_it_if_the_move_fails(sched):
    s = sched
    _parked_gang(s)
    s.jobs["c1"].state = "running"
    for cjob in ("g", "c1"):
        s.intents.carry_out(Intent("migrate", cjob, "m2", 0, "policy Resume", (0, 1) if cjob == "g" else (0,)))
        s._daemon_node_event("m2", b"m2", {"name": "m2", "cjob": cjob, "event": "ready", "detail": "", "data": {}},
                             None)
    sent = {args["xfer"].split("-")[0]: args["resume"] for _, action, args in s.wire if action == "migrate_out"}
    assert sent == {"g": False, "c1": True}
    s.moves.target_failed(s.jobs["g"], "m2 failed")         # while the source sends: the send is given up
    (abandon,) = [args for _, action, args in s.wire if action == "abandon"]
    assert abandon == {"of": "send", "resume": False}
