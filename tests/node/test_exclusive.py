"""Multi-GPU jobs and gangs in an in-process gmuxd: exclusive GPUs, waiting, defragmentation, gang-wide
commands, and refusals that name the problem."""
import signal
import subprocess

import msgpack

from gmux import protocol
from gmux.rundir import proc_starttime
from node_harness import GiB, ask, register


def commands(d, identity):
    return [m for i, m in d.sent if i == identity and m["type"] == "command"]


def ack(d, identity, reg, cmd, ok=True, state=None):
    d.server.receive(identity, [protocol.encode("result", 9, job=reg["job"], token=reg["token"], cmd=cmd["cmd"],
                                          kind=cmd["kind"], result={"ok": ok}, **({"state": state} if state else {}))])


def tick(d, n=1):
    d.sent.clear()
    for _ in range(n):
        d.tick()


def _suspended(d, key, **kw):
    """A job registered (with `kw`), started and then suspended by its user: its registration."""
    reg = register(d, key, migratable=True, **kw)
    tick(d)
    ack(d, key, reg, commands(d, key)[0])
    assert ask(d, "suspend", admin=d.admin, job=reg["job"]) is None
    ack(d, key, reg, commands(d, key)[0], state="suspended")
    return reg


def test_multi_gpu_job_waits_then_defrag_frees_whole_gpus_for_it(daemon_factory):
    d = daemon_factory((16 * GiB,) * 3)
    a, b = register(d, b"a", mem=GiB), register(d, b"b", mem=GiB)
    assert (a["gpu"], b["gpu"]) == (0, 1)
    c = register(d, b"c", gpus=2, mem=GiB)
    assert c["gpu"] is None and c["env"] == {}
    assert "2 GPUs to itself" in d.jobs[c["job"]].detail
    r = ask(d, "migrate", admin=d.admin, job=c["job"], gpu=1)     # (it said "holds GPUs  to itself")
    assert not r["ok"] and "runs on 2 GPUs (it holds none now); gmux migrate moves single-GPU jobs" in r["error"]
    tick(d, 2)    # defragment (a has not started: it moves by bookkeeping), then give c its GPUs
    kinds = [x["kind"] for x in d.decisions]
    assert kinds.index("defrag") < kinds.index("exclusive")
    defrag = next(x for x in d.decisions if x["kind"] == "defrag")
    assert defrag["numbers"]["need"] == 2 and defrag["numbers"]["free"] == [2] and defrag["numbers"]["bytes"] == 0
    assert [m["job"] for m in defrag["numbers"]["moves"]] == [a["job"]]
    assert d.jobs[a["job"]].gpu == 1 and d.jobs[c["job"]].exclusive_gpus == [0, 2]
    (start,) = commands(d, b"c")
    assert start["kind"] == "resume" and start["args"]["env"]["GMUX_VIRTUAL_GPU"] == "0,2"
    # While c holds GPUs 0 and 2, a new job shares GPU 1 (time-sliced), never c's GPUs.
    e = register(d, b"e")
    assert e["gpu"] == 1
    assert set(d.slicers[0].entries) == {c["job"]} and not d.slicers[2].entries
    ps = ask(d, "ps", admin=d.admin)["data"]
    assert [g["owner"] for g in ps["gpus"]] == [c["job"], None, c["job"]]
    r = ask(d, "migrate", admin=d.admin, job=a["job"], gpu=0)
    assert not r["ok"] and "held" in r["error"]
    r = ask(d, "migrate", admin=d.admin, job=c["job"], gpu=1)
    assert not r["ok"] and "single-GPU jobs" in r["error"]
    # When c ends, its GPUs are whole again for everyone.
    ask(d, "bye", b"c", job=c["job"], token=c["token"], status=0)
    assert register(d, b"f")["gpu"] in (0, 2)


def test_a_transparent_job_pins_its_gpu_and_the_wait_says_why(daemon_factory):
    # Real GPUs: a move is a new process (between virtual GPUs it is made in the job's own process, and a
    # transparent job moves too: tests/node/test_move_in_process.py)
    d = daemon_factory((16 * GiB,) * 2, virtual=False)
    a = register(d, b"a", mem=GiB)           # transparent mode (not migratable)
    tick(d)
    (start,) = commands(d, b"a")
    ack(d, b"a", a, start)                   # it has started: it cannot be restored elsewhere
    c = register(d, b"c", gpus=2)
    tick(d, 3)
    (wait,) = [x for x in d.decisions if x["kind"] == "wait"]
    assert "cannot move" in wait["text"] and "transparent mode" in wait["text"]
    assert "transparent mode" in d.jobs[c["job"]].detail and d.jobs[c["job"]].state == "waiting"
    assert not any(x["kind"] == "defrag" for x in d.decisions)


def test_gang_is_placed_on_distinct_gpus_and_suspended_resumed_killed_as_one(daemon):
    r0 = register(daemon, b"r0", gang={"id": "g", "rank": 0, "size": 2}, migratable=True)
    tick(daemon)
    assert not commands(daemon, b"r0") and "1 of 2 registered" in daemon.jobs[r0["job"]].detail
    r1 = register(daemon, b"r1", gang={"id": "g", "rank": 1, "size": 2}, migratable=True)
    tick(daemon)
    starts = {k: commands(daemon, k)[0] for k in (b"r0", b"r1")}
    assert {s["args"]["env"]["GMUX_VIRTUAL_GPU"] for s in starts.values()} == {"0", "1"}
    assert daemon.jobs[r0["job"]].exclusive_gpus == [0] and daemon.jobs[r1["job"]].exclusive_gpus == [1]
    for k, reg in ((b"r0", r0), (b"r1", r1)):
        ack(daemon, k, reg, starts[k])
    # One rank is named; both suspend (the commands leave with the request), and the reply waits for both.
    assert ask(daemon, "suspend", admin=daemon.admin, job=r1["job"]) is None
    stops = {k: commands(daemon, k)[0] for k in (b"r0", b"r1")}
    assert {s["kind"] for s in stops.values()} == {"suspend"}
    daemon.sent.clear()
    ack(daemon, b"r0", r0, stops[b"r0"], state="suspended")
    assert not [m for i, m in daemon.sent if i == b"c"]
    ack(daemon, b"r1", r1, stops[b"r1"], state="suspended")
    (reply,) = [m for i, m in daemon.sent if i == b"c"]
    assert reply["ok"] and reply["data"]["jobs"] == [r0["job"], r1["job"]]
    r = ask(daemon, "resume", admin=daemon.admin, job=r0["job"])
    assert r["data"]["jobs"] == [r0["job"], r1["job"]]
    assert not any(daemon.jobs[j].held for j in (r0["job"], r1["job"]))
    r = ask(daemon, "migrate", admin=daemon.admin, job=r0["job"], gpu=1)
    assert not r["ok"] and "process group" in r["error"]
    r = ask(daemon, "kill", admin=daemon.admin, job=r0["job"])
    assert r["data"]["jobs"] == [r0["job"], r1["job"]]
    assert {daemon.jobs[j].state for j in (r0["job"], r1["job"])} == {"killed"}


def test_a_failed_rank_ends_its_gang_and_a_transparent_gang_is_not_suspended(daemon):
    ranks = [subprocess.Popen(["sleep", "600"], start_new_session=True) for _ in range(2)]
    try:
        r0, r1 = (register(daemon, b"r%d" % n, pid=p.pid, starttime=proc_starttime(p.pid),
                           gang={"id": "g", "rank": n, "size": 2}) for n, p in enumerate(ranks))
        tick(daemon)
        r = ask(daemon, "suspend", admin=daemon.admin, job=r1["job"])
        assert not r["ok"] and "transparent mode" in r["error"] and "--no-hook" in r["error"]
        assert not any(daemon.jobs[j].held for j in (r0["job"], r1["job"]))
        ask(daemon, "bye", b"r0", job=r0["job"], token=r0["token"], status=1)
        assert ranks[1].wait(30) == -signal.SIGKILL and ranks[0].poll() is None
        daemon._last_reap = 0.0
        tick(daemon)
        assert (daemon.jobs[r1["job"]].state, daemon.jobs[r1["job"]].detail) == ("killed", "rank 0 of its gang failed")
        assert any(x["kind"] == "gang" and "killing its peers" in x["text"] for x in daemon.decisions)
    finally:
        for p in ranks:
            p.kill()
            p.wait()


def test_a_rank_killed_from_outside_and_not_yet_reapable_is_told_as_it_ended_not_as_killed_for_its_peer(daemon):
    """kill -9 of rank 1 (CI): rank 0's connection reset and it failed; rank 1's first thread had exited (no
    process to signal) but its others still closed what it held, so it could not be reaped yet. gmuxd said it
    "killed: rank 0 of its gang failed", where it was killed from outside and reaped, as such, a moment later."""
    r0 = register(daemon, b"r0", gang={"id": "g", "rank": 0, "size": 2})
    r1 = register(daemon, b"r1", gang={"id": "g", "rank": 1, "size": 2})
    tick(daemon)
    own_end = []     # (rank 1's end as its reaping will tell it: none until it can be reaped)
    daemon.sup.kill_together = lambda jobs: ["ended"] * len(jobs)
    daemon.sup.ended = lambda job: own_end[0] if own_end and job.id == r1["job"] else None
    ask(daemon, "bye", b"r0", job=r0["job"], token=r0["token"], status=1)
    assert daemon.jobs[r0["job"]].state == "failed" and not daemon.jobs[r1["job"]].final
    own_end.append(("lost", None, "killed by signal 9 (SIGKILL) from outside gmux"))
    daemon._last_reap = 0.0
    tick(daemon)
    assert (daemon.jobs[r1["job"]].state, daemon.jobs[r1["job"]].detail) == own_end[0][::2]


def test_bad_multi_gpu_and_gang_registrations_are_refused_by_name(daemon):
    def refused(**kw):
        r = ask(daemon, "register", b"x", pid=daemon.stand_in_pid, argv=["python", "t.py"], **kw)
        assert not r["ok"]
        return r["error"]
    assert "asks for 3 GPUs; this machine has 2" in refused(gpus=3)
    assert "a gang rank uses one GPU" in refused(gpus=2, gang={"id": "g", "rank": 0, "size": 2})
    assert "--gpu pins a single-GPU job" in refused(gpus=2, gpu=0)
    assert "each rank needs a GPU of its own" in refused(gang={"id": "big", "rank": 0, "size": 3})
    register(daemon, b"r0", gang={"id": "g", "rank": 0, "size": 2})
    assert "gang g has 2 ranks" in refused(gang={"id": "g", "rank": 1, "size": 3})
    assert "rank 0 of gang g is already registered" in refused(gang={"id": "g", "rank": 0, "size": 2})
    # Checked on the wire: the rank must be below the size, and gpus at least 1.
    for bad, needle in (({"gang": {"id": "g", "rank": 2, "size": 2}}, "rank 2 is not below the gang's size 2"),
                        ({"gpus": 0}, "register.gpus: 0 is outside"),
                        ({"gang": {"id": "g", "rank": 0}}, "exactly the fields id, rank, size")):
        daemon.sent.clear()
        daemon.server.receive(b"x", [msgpack.packb({"v": protocol.VERSION, "type": "register", "id": 1,
                                              "pid": daemon.stand_in_pid, "argv": ["t.py"], **bad})])
        (reply,) = [m for _, m in daemon.sent]
        assert not reply["ok"] and needle in reply["error"], reply


def test_submit_ranks_gives_each_rank_its_rendezvous(daemon, tmp_path):
    # The ranks' processes are real (gmux-launch of a script that does not exist): what matters is their env.
    r = ask(daemon, "submit", admin=daemon.admin, argv=["python", str(tmp_path / "absent.py")], cwd=str(tmp_path),
            ranks=2, name="g")
    assert r["ok"], r
    jobs = [daemon.jobs[j] for j in r["data"]["jobs"]]
    assert [j.gang for j in jobs] == [{"id": "g", "rank": k, "size": 2} for k in range(2)]
    assert [j.env["RANK"] for j in jobs] == ["0", "1"]
    assert {j.env["WORLD_SIZE"] for j in jobs} == {"2"} and {j.env["LOCAL_RANK"] for j in jobs} == {"0"}
    assert len({j.env["MASTER_PORT"] for j in jobs}) == 1 and jobs[0].env["MASTER_ADDR"] == "127.0.0.1"
    assert "a gang named g is running" in ask(daemon, "submit", admin=daemon.admin, argv=["python", "x.py"],
                                              cwd=str(tmp_path), ranks=2, name="g")["error"]
    assert "--ranks N starts N single-GPU ranks" in ask(daemon, "submit", admin=daemon.admin, argv=["x.py"],
                                                        cwd=str(tmp_path), ranks=2, gpus=2)["error"]
    for j in jobs:
        daemon.sup.kill(j)
        daemon.sup.children[j.pid].wait(30)


def test_a_restarted_daemon_keeps_waiting_jobs_queued_and_held_gpus_held(daemon_factory, tmp_path):
    d = daemon_factory(root=str(tmp_path / "rt"))
    a = register(d, b"a")
    tick(d)
    ack(d, b"a", a, commands(d, b"a")[0])   # started in transparent mode: it pins GPU 0
    r0 = register(d, b"r0", gang={"id": "g", "rank": 0, "size": 1})
    c = register(d, b"c", gpus=2)
    tick(d)
    assert d.jobs[r0["job"]].exclusive_gpus == [1] and d.jobs[c["job"]].gpu is None
    d._flush(force=True)
    again = daemon_factory(root=str(tmp_path / "rt"))     # the same tables, as after a crash
    assert again.admission.queue == [c["job"]] and set(again.slicers[1].entries) == {r0["job"]}
    e = register(again, b"e")
    assert e["gpu"] == 0                                     # GPU 1 is still the gang's
    for k, reg in ((b"r0", r0), (b"a", a)):
        ask(again, "bye", k, job=reg["job"], token=reg["token"], status=0)
    tick(again, 2)
    assert again.jobs[c["job"]].gpu is None                  # e is on GPU 0, and has no other GPU to go to
    assert "no way to free 2 whole GPUs" in again.jobs[c["job"]].detail
    ask(again, "bye", b"e", job=e["job"], token=e["token"], status=0)
    tick(again)
    assert again.jobs[c["job"]].exclusive_gpus == [0, 1]


def test_a_job_that_cannot_be_helped_does_not_block_defrag_for_a_later_one(daemon_factory):
    daemon = daemon_factory(virtual=False)   # real GPUs: a transparent job cannot move (a new process would not
    t = register(daemon, b"t")               # restore it); between virtual GPUs it would move in its process
    tick(daemon)
    ack(daemon, b"t", t, commands(daemon, b"t")[0])      # transparent and started: GPU 0 is pinned
    m = register(daemon, b"m", migratable=True)            # on GPU 1, not started: movable
    assert m["gpu"] == 1
    big = register(daemon, b"big", gpus=2)                 # needs GPU 0 too: waits
    r0 = register(daemon, b"r0", gang={"id": "solo", "rank": 0, "size": 1})
    tick(daemon, 2)
    assert daemon.jobs[big["job"]].gpu is None
    (wait,) = [x for x in daemon.decisions if x["kind"] == "wait"]
    assert wait["jobs"] == [big["job"]] and "cannot move" in wait["text"]
    (defrag,) = [x for x in daemon.decisions if x["kind"] == "defrag"]
    assert defrag["numbers"]["unit"] == "gang solo" and defrag["numbers"]["gpus"] == [1]
    assert daemon.jobs[m["job"]].gpu == 0 and daemon.jobs[r0["job"]].exclusive_gpus == [1]


def test_a_suspended_gang_gives_its_gpus_back_and_resumes_on_them(daemon_factory, tmp_path):
    d = daemon_factory((16 * GiB,) * 3, root=str(tmp_path / "rt"))
    ranks = {k: register(d, k, gang={"id": "g", "rank": r, "size": 2}, migratable=True)
             for r, k in enumerate((b"r0", b"r1"))}
    tick(d)
    for k, reg in ranks.items():
        ack(d, k, reg, commands(d, k)[0])
    ids = [reg["job"] for reg in ranks.values()]
    assert [d.jobs[j].exclusive_gpus for j in ids] == [[0], [1]]
    assert ask(d, "suspend", admin=d.admin, job=ids[0]) is None
    stops = {k: commands(d, k)[0] for k in ranks}
    for k, reg in ranks.items():
        ack(d, k, reg, stops[k], state="suspended")
    tick(d)
    # Suspended and held: its GPUs are free for others, and it says so.
    assert [(d.jobs[j].gpu, d.jobs[j].exclusive_gpus, d.jobs[j].parked_gpus) for j in ids] == [(None, [], [0]),
                                                                                              (None, [], [1])]
    assert [x["numbers"]["gpus"] for x in d.decisions if x["kind"] == "park"] == [[0], [1]]
    ps = ask(d, "ps", admin=d.admin)["data"]
    assert [g["owner"] for g in ps["gpus"]] == [None, None, None]
    assert {j["state"] for j in ps["jobs"]} == {"held"} and "gave back GPU 0" in ps["jobs"][0]["detail"]
    # A restarted daemon keeps it parked, out of the queue.
    d._flush(force=True)
    d = daemon_factory((16 * GiB,) * 3, root=str(tmp_path / "rt"))
    assert d.admission.queue == [] and not any(d.slicers[g].entries for g in d.slicers)
    assert [d.jobs[j].parked_gpus for j in ids] == [[0], [1]]
    for k, reg in ranks.items():     # the ranks' agents are heard from (a heartbeat a second)
        ask(d, "heartbeat", k, job=reg["job"], token=reg["token"], state="suspended")
    assert {d.jobs[j].state for j in ids} == {"held"}
    other = register(d, b"o", migratable=True)      # lands on a GPU the gang gave back (not started: movable)
    assert other["gpu"] == 0
    r = ask(d, "resume", admin=d.admin, job=ids[1])
    # (every rank's GPUs: it named only the asked rank's, "waits for GPUs 1")
    assert r["ok"] and "takes back GPUs 0,1 (given back while suspended)" in r["data"]["state"], r
    assert d.admission.queue == ids
    assert "waiting for GPU 0 back" in d.jobs[ids[0]].detail
    tick(d, 2)        # the newcomer is moved off GPU 0, then each rank gets its own GPU back
    (defrag,) = [x for x in d.decisions if x["kind"] == "defrag"]
    assert defrag["numbers"]["gpus"] == [0, 1] and [m["job"] for m in defrag["numbers"]["moves"]] == [other["job"]]
    assert d.jobs[other["job"]].gpu == 2
    assert [(d.jobs[j].exclusive_gpus, d.jobs[j].parked_gpus) for j in ids] == [([0], []), ([1], [])]
    for k, gpu in ((b"r0", "0"), (b"r1", "1")):
        (go,) = [c for c in commands(d, k) if c["kind"] == "resume"]
        assert go["args"]["env"]["GMUX_VIRTUAL_GPU"] == gpu


def test_a_parked_job_suspended_again_while_it_waits_leaves_the_queue(daemon_factory):
    daemon = daemon_factory(virtual=False)   # real GPUs, where a started transparent job cannot move
    c = register(daemon, b"c", gpus=2, migratable=True)
    tick(daemon)
    ack(daemon, b"c", c, commands(daemon, b"c")[0])
    assert ask(daemon, "suspend", admin=daemon.admin, job=c["job"]) is None
    ack(daemon, b"c", c, commands(daemon, b"c")[0], state="suspended")
    tick(daemon)
    job = daemon.jobs[c["job"]]
    assert job.parked_gpus == [0, 1] and job.gpu is None
    e = register(daemon, b"e")                       # transparent: once started it cannot move
    tick(daemon)
    ack(daemon, b"e", e, commands(daemon, b"e")[0])
    ask(daemon, "resume", admin=daemon.admin, job=c["job"])
    tick(daemon, 2)
    assert job.gpu is None and "cannot move" in job.detail          # e pins one of its GPUs
    r = ask(daemon, "suspend", admin=daemon.admin, job=c["job"])
    assert r["ok"] and r["data"]["state"] == "held" and daemon.admission.queue == [] and job.state == "held"
    ask(daemon, "bye", b"e", job=e["job"], token=e["token"], status=0)
    tick(daemon, 2)
    assert job.gpu is None and job.parked_gpus == [0, 1]            # held: it takes its GPUs only when resumed
    ask(daemon, "resume", admin=daemon.admin, job=c["job"])
    tick(daemon)
    assert job.exclusive_gpus == [0, 1] and [x["kind"] for x in commands(daemon, b"c")] == ["resume"]


def test_a_gang_killed_at_daemon_shutdown_says_so_for_every_rank(daemon):
    """Ranks were ended one by one, unasked: the first one's end killed its peers "as rank 0 of its gang ..."."""
    regs = [register(daemon, f"r{i}".encode(), gang={"id": "g", "rank": i, "size": 2}) for i in range(2)]
    tick(daemon)
    assert ask(daemon, "shutdown", admin=daemon.admin, kill_jobs=True)["ok"]
    assert [(daemon.jobs[r["job"]].state, daemon.jobs[r["job"]].detail) for r in regs] == \
        [("killed", "killed at daemon shutdown")] * 2
    assert not any(x["kind"] == "gang" for x in daemon.decisions)


def test_a_suspended_job_pinned_where_a_gang_must_go_gives_its_gpu_back_until_the_gang_lets_go(daemon_factory):
    # As a cluster scheduler places them: the job pinned to GPU 0, later suspended for a gang pinned to 0 and 1.
    d = daemon_factory((16 * GiB,) * 3)
    c = _suspended(d, b"c", gpu=0)
    tick(d, 2)
    job = d.jobs[c["job"]]
    assert (job.gpu, job.parked_gpus) == (0, [])        # nothing needs its GPU: it stays held there
    ranks = {k: register(d, k, gang={"id": "g", "rank": r, "size": 2}, gpu=r, migratable=True)
             for r, k in enumerate((b"r0", b"r1"))}
    ids = [reg["job"] for reg in ranks.values()]
    tick(d, 2)        # (before: the gang waited for good, "the pinned GPU 0 cannot be freed")
    assert (job.gpu, job.parked_gpus, job.state) == (None, [0], "held") and "gave back GPU 0" in job.detail
    assert [d.jobs[j].exclusive_gpus for j in ids] == [[0], [1]]
    for k, reg in ranks.items():
        ack(d, k, reg, commands(d, k)[0])
    r = ask(d, "resume", admin=d.admin, job=c["job"])
    assert r["ok"] and "takes back GPU 0 (given back while suspended) once it is free" in r["data"]["state"], r
    tick(d)
    assert job.gpu is None and "waiting for GPU 0 back" in job.detail     # the gang keeps it
    assert ask(d, "suspend", admin=d.admin, job=ids[0]) is None
    stops = {k: commands(d, k)[-1] for k in ranks}
    for k, reg in ranks.items():
        ack(d, k, reg, stops[k], state="suspended")
    tick(d, 2)        # the gang parks, and the job takes its GPU back and runs there again
    assert [d.jobs[j].parked_gpus for j in ids] == [[0], [1]]
    assert (job.gpu, job.parked_gpus) == (0, [])
    (go,) = [m for m in commands(d, b"c") if m["kind"] == "resume"]
    assert go["args"]["env"]["GMUX_VIRTUAL_GPU"] == "0"


def test_a_rank_registering_after_its_gang_was_suspended_is_held_with_it(daemon_factory):
    d = daemon_factory((16 * GiB,) * 2)
    r0 = register(d, b"r0", gang={"id": "g", "rank": 0, "size": 2}, migratable=True)
    assert ask(d, "suspend", admin=d.admin, job=r0["job"])["data"]["state"] == "held"     # not placed yet
    r1 = register(d, b"r1", gang={"id": "g", "rank": 1, "size": 2}, migratable=True)
    ids = [r0["job"], r1["job"]]
    tick(d, 2)
    # (before: rank 1 showed "waiting" beside its held peer, and nothing said the gang was held)
    assert [(d.jobs[j].state, d.jobs[j].held, d.jobs[j].gpu) for j in ids] == [("held", True, None)] * 2
    assert {j["state"] for j in ask(d, "ps", admin=d.admin)["data"]["jobs"]} == {"held"}
    r = ask(d, "resume", admin=d.admin, job=r1["job"])
    assert r["ok"] and r["data"]["jobs"] == ids
    tick(d)
    assert [d.jobs[j].exclusive_gpus for j in ids] == [[0], [1]]


def test_a_suspended_job_that_can_move_is_moved_out_of_a_pinned_gangs_way_not_parked(daemon_factory):
    d = daemon_factory((16 * GiB,) * 3)
    m = _suspended(d, b"m")
    job = d.jobs[m["job"]]
    assert job.gpu == 0
    for r, k in enumerate((b"r0", b"r1")):
        register(d, k, gang={"id": "g", "rank": r, "size": 2}, gpu=r, migratable=True)
    tick(d, 2)
    # Moved to GPU 2 (held still: it resumes there at once when asked), not parked to wait for the gang; and
    # not to GPU 1, which rank 1 is pinned to (before: moved there first, and again once rank 1 planned).
    assert (job.gpu, job.parked_gpus, job.held) == (2, [], True)
    assert [m["job"] for x in d.decisions if x["kind"] == "defrag" for m in x["numbers"]["moves"]] == [job.id]


def test_a_parked_job_moved_since_it_was_pinned_takes_back_the_gpu_it_gave(daemon_factory):
    # Started pinned to GPU 0 (as a cluster scheduler starts it), moved to GPU 2, parked there for a gang
    # pinned to GPUs 1 and 2 (found in review: resumed, it was seated on GPU 2 beside rank 1, having checked
    # only that GPU 0, its old pin, had room).
    d = daemon_factory((16 * GiB,) * 3)
    c = _suspended(d, b"c", gpu=0)
    tick(d)
    r = ask(d, "migrate", admin=d.admin, job=c["job"], gpu=2)
    assert r is None or r["ok"], r
    tick(d, 2)
    job = d.jobs[c["job"]]
    assert (job.gpu, job.pinned) == (2, 0)
    ranks = {k: register(d, k, gang={"id": "g", "rank": r, "size": 2}, gpu=r + 1, migratable=True)
             for r, k in enumerate((b"r0", b"r1"))}
    ids = [reg["job"] for reg in ranks.values()]
    tick(d, 2)
    assert (job.gpu, job.parked_gpus) == (None, [2]) and [d.jobs[j].exclusive_gpus for j in ids] == [[1], [2]]
    for k, reg in ranks.items():
        ack(d, k, reg, commands(d, k)[0])
    assert ask(d, "resume", admin=d.admin, job=c["job"])["ok"]
    tick(d, 2)
    assert job.gpu is None and set(d.slicers[2].entries) == {ids[1]}     # it waits for GPU 2, not beside rank 1


def test_a_defragmentation_leaves_alone_the_gpu_another_waiting_unit_is_pinned_to(daemon_factory):
    # Real GPUs: the transparent job t cannot move (a new process could not restore it); it keeps gang h, pinned
    # to GPU 2, waiting. Gang g's plan moves x off GPU 0 to GPU 3, not onto GPU 2, the least loaded.
    d = daemon_factory((16 * GiB,) * 4, virtual=False)
    x = register(d, b"x", mem=GiB, migratable=True)
    others = {k: register(d, k, gpu=gpu, mem=GiB) for k, gpu in ((b"t", 2), (b"y", 3), (b"z", 3))}
    tick(d)
    for k, reg in ((b"x", x), *others.items()):
        for cmd in commands(d, k)[:1]:        # (y and z take turns on GPU 3: one starts first)
            ack(d, k, reg, cmd)
    assert d.jobs[x["job"]].gpu == 0
    register(d, b"h0", gang={"id": "h", "rank": 0, "size": 1}, gpu=2, migratable=True)
    for r, k in enumerate((b"g0", b"g1")):
        register(d, k, gang={"id": "g", "rank": r, "size": 2}, gpu=r, migratable=True)
    d.sent.clear()
    tick(d, 2)
    moved = [(m["job"], m["dst"]) for z in d.decisions if z["kind"] == "defrag" for m in z["numbers"]["moves"]]
    assert moved == [(x["job"], 3)], moved
    assert not [m for m in commands(d, b"t") if m["kind"] == "migrate"]


def test_a_gangs_ranks_pinned_by_a_scheduler_are_placed_all_at_once(daemon_factory):
    # Ranks pinned to GPUs 0 and 1, GPU 0 held by a job that cannot move: rank 1 does not take GPU 1 alone to
    # wait there in its first collective (before: it did), and both start once GPU 0 is free.
    d = daemon_factory((16 * GiB,) * 2, virtual=False)
    t = register(d, b"t", gpu=0, mem=GiB)
    tick(d)
    ack(d, b"t", t, commands(d, b"t")[0])
    ids = [register(d, k, gang={"id": "g", "rank": r, "size": 2}, gpu=r, migratable=True)["job"]
           for r, k in enumerate((b"g0", b"g1"))]
    tick(d, 2)
    assert [d.jobs[j].exclusive_gpus for j in ids] == [[], []]
    assert "the pinned GPU 0 cannot be freed" in d.jobs[ids[1]].detail
    d.finish(d.jobs[t["job"]], "exited", 0, "")
    tick(d)
    assert [d.jobs[j].exclusive_gpus for j in ids] == [[0], [1]]


def _stopped_before_its_boundary(d, **suspend):
    """A job pinned to GPU 0, suspended by its user (with `suspend`'s fields), past the suspend's deadline before
    its boundary: stopped by gmuxd (SIGSTOP), held, its memory still there. (its registration, its job, the
    suspend command it has not answered)"""
    reg = register(d, b"c", migratable=True, gpu=0)
    tick(d)
    ack(d, b"c", reg, commands(d, b"c")[0])
    job = d.jobs[reg["job"]]
    assert ask(d, "suspend", admin=d.admin, job=reg["job"], **suspend) is None      # (answered at its boundary)
    (stop,) = commands(d, b"c")
    d.slicers[0].entries[job.id].sent_at -= 60        # past its deadline
    tick(d)
    assert d.slicers[0].entries[job.id].stopped and job.gpu == 0
    return reg, job, stop


def test_a_suspended_job_stopped_before_its_boundary_is_continued_to_it_where_a_gang_waits(daemon_factory):
    # (found in review) A gang pinned to GPUs 0 and 1 waits for GPU 0: the job is continued to its boundary,
    # suspends there and parks (before: it stayed stopped on GPU 0 and the gang waited for good).
    d = daemon_factory((16 * GiB,) * 3)
    reg, job, stop = _stopped_before_its_boundary(d)
    ids = [register(d, k, gang={"id": "g", "rank": r, "size": 2}, gpu=r, migratable=True)["job"]
           for r, k in enumerate((b"r0", b"r1"))]
    tick(d, 2)
    assert not d.slicers[0].entries[job.id].stopped                   # continued, to reach its boundary
    ack(d, b"c", reg, stop, state="suspended")                        # it suspends there
    tick(d, 2)
    assert (job.gpu, job.parked_gpus) == (None, [0])
    assert [d.jobs[j].exclusive_gpus for j in ids] == [[0], [1]]


def test_a_job_stopped_at_a_fences_deadline_is_not_continued_for_a_waiting_gang(daemon_factory):
    # (found in review) A machine cut off from its scheduler suspends its cluster jobs with a deadline
    # (cluster_fence: deadline_s); one that misses it is stopped, so that it does not train beside the copy the
    # scheduler starts elsewhere. A gang waiting for its GPU must not continue it, without a deadline, to its
    # boundary.
    d = daemon_factory((16 * GiB,) * 3)
    reg, job, _ = _stopped_before_its_boundary(d, deadline_s=1.0)
    for r, k in enumerate((b"r0", b"r1")):
        register(d, k, gang={"id": "g", "rank": r, "size": 2}, gpu=r, migratable=True)
    tick(d, 20)
    assert d.slicers[0].entries[job.id].stopped, job.detail           # not continued: it stays stopped
