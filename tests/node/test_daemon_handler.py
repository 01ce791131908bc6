"""gmuxd's message handling in-process: authentication, refusals with reasons, and fuzzing.

The daemon runs in this process (its socket is real, in a private runtime dir) and its replies are captured,
so thousands of generated messages go through the real decode -> validate -> handle path quickly.
"""
import os
import stat
import threading
import time

import msgpack
import pytest
import zmq
from hypothesis import HealthCheck, given, settings, strategies as st

from gmux import protocol
from gmux.node.daemon import Daemon, Options
from gmux.node.inventory import Gpu
from gmux.rundir import RuntimeDir
from gmux_testkit import fuzz_examples
from node_harness import GiB, ask, register


def test_private_runtime_dir_and_socket(daemon):
    assert stat.S_IMODE(os.stat(daemon.rundir.root).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(daemon.rundir.socket).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(daemon.rundir.admin_token_file).st_mode) == 0o600


def test_register_gets_token_and_a_start_command(daemon):
    a = register(daemon, mem=GiB)
    assert a["job"] == "j1" and len(a["token"]) == 32 and a["env"]["GMUX_VIRTUAL_GPU"] == "0"
    daemon.sent.clear()
    daemon.tick()
    (cmd,) = [m for i, m in daemon.sent if m["type"] == "command"]
    assert cmd["kind"] == "resume" and daemon.sent[0][0] == b"job-a"


def _result(d, identity, reg, cmd, **extra):
    d.sent.clear()
    d.server.receive(identity, [protocol.encode("result", 9, job=reg["job"], token=reg["token"], cmd=cmd["cmd"],
                                          kind=cmd["kind"], result={"ok": True}, **extra)])
    return [m for i, m in d.sent if m["type"] == "reply" and i == b"c"]


def test_a_suspend_is_sent_at_once_and_its_latency_split_at_the_jobs_boundary(daemon):
    a = register(daemon, mem=GiB)
    daemon.sent.clear()
    daemon.tick()
    (start,) = [m for i, m in daemon.sent if m["type"] == "command"]
    _result(daemon, b"job-a", a, start)
    # The command leaves with the request (no tick in between); the reply waits for the job.
    assert ask(daemon, "suspend", admin=daemon.admin, job=a["job"]) is None
    (stop,) = [m for i, m in daemon.sent if m["type"] == "command"]
    assert stop["kind"] == "suspend"
    job_id, kind, sent = daemon.commands.inflight[stop["cmd"]]
    sent -= 0.010    # as if sent 10 ms ago, and taken at a boundary 4 ms after that
    daemon.commands.inflight[stop["cmd"]] = (job_id, kind, sent)
    (reply,) = _result(daemon, b"job-a", a, stop, taken_at=sent + 0.004, state="suspended")
    data = reply["data"]
    assert reply["ok"] and data["boundary_wait_s"] == pytest.approx(0.004)
    assert data["job_latency_s"] >= 0.010 > data["boundary_wait_s"]
    # A command that reached the job during the poll of the boundary it was taken at waited for nothing; a
    # stamp from the future (another clock) is not believed.
    for taken, expected in ((-0.001, 0.0), (3600.0, None)):
        ask(daemon, "resume", admin=daemon.admin, job=a["job"])
        (go,) = [m for i, m in daemon.sent if m["type"] == "command"]
        _result(daemon, b"job-a", a, go, state="running")
        ask(daemon, "suspend", admin=daemon.admin, job=a["job"])
        (stop,) = [m for i, m in daemon.sent if m["type"] == "command"]
        (reply,) = _result(daemon, b"job-a", a, stop, taken_at=daemon.commands.inflight[stop["cmd"]][2] + taken,
                           state="suspended")
        assert reply["data"].get("boundary_wait_s") == expected


def test_a_suspend_taken_at_the_jobs_first_boundary_says_it_was_starting(daemon):
    """A job suspended before its first mini-batch (importing torch, loading its data) was said to have waited
    seconds "for the mini-batch to end"."""
    from gmux.cli.gmux import _outcome
    a = register(daemon, mem=GiB)
    daemon.sent.clear()
    daemon.tick()
    (start,) = [m for i, m in daemon.sent if m["type"] == "command"]
    _result(daemon, b"job-a", a, start)
    said = []
    for boundaries in (1, 5):
        ask(daemon, "suspend", admin=daemon.admin, job=a["job"])
        (stop,) = [m for i, m in daemon.sent if m["type"] == "command"]
        job_id, kind, sent = daemon.commands.inflight[stop["cmd"]]
        daemon.commands.inflight[stop["cmd"]] = (job_id, kind, sent - 0.6)    # as if sent 0.6 s ago
        (reply,) = _result(daemon, b"job-a", a, stop, taken_at=sent - 0.1, state="suspended", boundaries=boundaries)
        said.append(_outcome("suspend", reply["data"]))
        ask(daemon, "resume", admin=daemon.admin, job=a["job"])
        (go,) = [m for i, m in daemon.sent if m["type"] == "command"]
        _result(daemon, b"job-a", a, go, state="running", boundaries=boundaries)
    assert "waiting for its first boundary: it was still starting" in said[0]
    assert "waiting for the mini-batch to end" in said[1] and "first" not in said[1]


def test_a_job_can_only_act_on_itself(daemon):
    a = register(daemon, b"job-a")
    b = register(daemon, b"job-b")
    r = ask(daemon, "bye", b"job-a", job=b["job"], token=a["token"], status=0)
    assert not r["ok"] and "can only act on itself" in r["error"]
    assert daemon.jobs[b["job"]].state != "exited"
    # Admin requests need the admin token: a job's token does not do.
    r = ask(daemon, "kill", b"job-a", admin=a["token"], job=b["job"])
    assert not r["ok"] and "admin token" in r["error"]
    assert daemon.jobs[b["job"]].state != "killed"


def test_refusals_say_what_to_do(daemon):
    r = ask(daemon, "migrate", admin=daemon.admin, job="j9", gpu=1)
    assert "gmux ps" in r["error"]
    register(daemon)
    r = ask(daemon, "migrate", admin=daemon.admin, job="j1", gpu=7)
    assert "no GPU 7" in r["error"]
    r = ask(daemon, "register", pid=daemon.stand_in_pid, argv=["x"], mem=64 * GiB)
    assert "cannot be a job" in ask(daemon, "register", pid=os.getpid(), argv=["x"])["error"]
    assert not r["ok"] and "largest GPU" in r["error"]
    daemon.server.receive(b"c", [b"\x93garbage"])
    assert not daemon.sent[-1][1]["ok"] and "msgpack" in daemon.sent[-1][1]["error"]
    daemon.server.receive(b"c", [msgpack.packb({"v": 2, "type": "ping", "id": 3})])
    assert "version 2" in daemon.sent[-1][1]["error"]


def test_placement_balances_gpus(daemon):
    gpus = [register(daemon, f"j{i}".encode())["env"]["GMUX_VIRTUAL_GPU"] for i in range(4)]
    assert sorted(gpus) == ["0", "0", "1", "1"]


names = st.sampled_from(["j1", "j2", "j999", "../x", ""])
small = st.recursive(st.none() | st.booleans() | st.integers(-(1 << 63), (1 << 63) - 1) | st.floats()
                     | st.text(max_size=12), lambda c: st.lists(c, max_size=3) | st.dictionaries(
                         st.text(max_size=6), c, max_size=3), max_leaves=8)


@st.composite
def messages(draw, tokens, pid):
    mtype = draw(st.sampled_from(sorted(protocol.MESSAGES) + ["junk"]))
    spec = protocol.MESSAGES.get(mtype, {})
    obj = {"v": draw(st.sampled_from([protocol.VERSION] * 9 + [0, "1"])), "type": mtype,
           "id": draw(st.integers(0, 1 << 40))}
    for name in spec:
        if draw(st.integers(0, 9)) == 0:
            continue          # sometimes a field is missing
        if name == "job":
            obj[name] = draw(names)
        elif name in ("token", "admin"):
            obj[name] = draw(st.sampled_from(tokens + ["nope"]))
        elif name == "state":
            obj[name] = draw(st.sampled_from(["running", "suspended", "waiting", "x"]))
        elif name == "kind":
            obj[name] = draw(st.sampled_from(list(protocol.COMMAND_KINDS) + ["x"]))
        elif name == "pid":
            obj[name] = draw(st.sampled_from([pid, 0, 1, os.getpid(), 1 << 30, -1]))   # gmuxd refuses 1 and itself
        elif name == "gpu":
            obj[name] = draw(st.integers(-1, 3))
        else:
            obj[name] = draw(small)
    if draw(st.integers(0, 9)) == 0:
        obj[draw(st.text(max_size=5))] = draw(small)
    return msgpack.packb(obj)


def test_fuzz_handler_thousands_of_messages(daemon):
    a = register(daemon, b"job-a")
    tokens = [a["token"], daemon.admin]
    count, examples = {"n": 0}, fuzz_examples(1500)

    @settings(max_examples=examples, deadline=None, suppress_health_check=list(HealthCheck))
    @given(messages(tokens, daemon.stand_in_pid))
    def one(frame):
        daemon.sent.clear()
        daemon.server.receive(b"fuzz", [frame])
        count["n"] += 1
        if count["n"] % 50 == 0:
            daemon.tick()
        sent_id = msgpack.unpackb(frame).get("id")
        replies = [m for i, m in daemon.sent if i == b"fuzz" and m["type"] == "reply" and m["id"] == sent_id]
        # One reply per message, except requests whose answer is deferred until a job acknowledges (a later
        # message that ends the job answers those too, under their own ids).
        assert len(replies) <= 1
    one()
    assert count["n"] >= examples
    assert daemon.internal_errors == 0
    r = ask(daemon, "ping")
    assert r["ok"]


def test_fuzz_over_the_socket_does_not_wedge(tmp_path):
    d = Daemon(RuntimeDir(str(tmp_path / "rt")), [Gpu(0, "virtual", 16 * GiB, True)], Options())
    stop = threading.Event()
    t = threading.Thread(target=d.serve, kwargs={"until": stop.is_set}, daemon=True)
    t.start()
    ctx = zmq.Context.instance()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(d.rundir.endpoint)
    try:
        import random
        rnd = random.Random(1)
        frames = [bytes(rnd.getrandbits(8) for _ in range(rnd.randint(0, 60))) for _ in range(3000)]
        got = 0

        def drain(until, timeout=30):
            nonlocal got
            deadline = time.monotonic() + timeout
            while got < until and time.monotonic() < deadline:
                if s.poll(1000):
                    m = msgpack.unpackb(s.recv())
                    assert m["type"] == "reply" and m["ok"] is False and m["error"]
                    got += 1
        # Sent in bursts and read as we go: gmuxd drops replies to a peer that does not read (rather than
        # block its loop), so a client that never reads would see only what fits in the queues.
        for i in range(0, 3000, 200):
            for f in frames[i:i + 200]:
                s.send(f)
            drain(i + 200)
        s.send_multipart([b"a", b"b"])                              # two frames
        s.send(b"\x00" * (protocol.MAX_FRAME + 10))                 # oversized
        drain(3002)
        assert got == 3002
        s.send(protocol.encode("ping", 77))
        assert s.poll(2000)
        m = msgpack.unpackb(s.recv())
        assert m["id"] == 77 and m["ok"]
        assert d.internal_errors == 0
    finally:
        s.close()
        stop.set()
        t.join(10)


def test_a_bug_in_one_gpus_tick_leaves_the_others_and_the_daemon_running(daemon, caplog):
    a = register(daemon, b"job-a", gpu=0, mem=GiB)
    b = register(daemon, b"job-b", gpu=1, mem=GiB)

    def broken(*args):
        raise RuntimeError("a packing bug")

    packer_step = daemon.packers[0].step
    daemon.packers[0].step = broken
    daemon.sent.clear()
    with caplog.at_level("ERROR", logger="gmux.daemon"):
        for _ in range(50):
            daemon.tick()
    started = {i for i, m in daemon.sent if m["type"] == "command" and m["kind"] == "resume"}
    assert started == {b"job-b"}     # GPU 1 went on; GPU 0's part failed before it started its job
    assert daemon.internal_errors == 50
    # One traceback, not one per tick, and it names the part that failed.
    logged = [r for r in caplog.records if "internal error" in r.getMessage()]
    assert len(logged) == 1 and "GPU 0" in logged[0].getMessage() and "a packing bug" in logged[0].exc_text
    assert ask(daemon, "ping")["data"]["internal_errors"] == 50
    assert daemon.jobs[b["job"]].state == "resuming" and ask(daemon, "ps", admin=daemon.admin)["ok"]
    # Once the part works again, its GPU catches up; a bug in parking held jobs does not keep the jobs' states
    # from being shown (they once shared a guard).
    daemon.packers[0].step = packer_step
    daemon.admission.park_held = broken
    daemon.sent.clear()
    daemon.tick()
    assert {i for i, m in daemon.sent if m["type"] == "command" and m["kind"] == "resume"} == {b"job-a"}
    assert daemon.jobs[a["job"]].state == "resuming" and daemon.internal_errors == 51
    daemon.expected_internal_errors = 51


def test_a_live_job_is_named_by_its_name_where_one_has_it(daemon):
    """`gmux suspend s1` for a job submitted with --name s1 said "no job 's1'" (found by an outside-user review)."""
    register(daemon, name="alone")
    register(daemon, b"job-b", name="twice")
    register(daemon, b"job-c", name="twice")
    assert "no GPU 7" in ask(daemon, "migrate", admin=daemon.admin, job="alone", gpu=7)["error"]   # found: j1
    r = ask(daemon, "migrate", admin=daemon.admin, job="twice", gpu=7)["error"]
    assert "2 live jobs are named 'twice' (j2, j3): give one of their ids" in r, r
    # the ranks of one gang may share a name (gmux-launch --name N -- torchrun ...): the name is the gang's
    for rank, identity in enumerate((b"job-d", b"job-e")):
        register(daemon, identity, name="ranks", gang={"id": "g", "rank": rank, "size": 2})
    assert "no GPU 7" in ask(daemon, "migrate", admin=daemon.admin, job="ranks", gpu=7)["error"]
    r = ask(daemon, "migrate", admin=daemon.admin, job="nobody", gpu=7)["error"]
    assert "no job 'nobody' (an id, or the name of a live job)" in r, r


def test_a_new_job_is_held_to_the_name_rule_and_one_coming_back_keeps_its_name(daemon):
    """A job's process back from a move or a spill, or adopted after a restart, registers again with the name it
    has; one an older gmux's rule allowed (j45) was refused at the wire, and the job could not come back."""
    for fields, said in (({"name": "j45"}, "register: name: 'j45' looks like a job id"),
                         ({"gang": {"id": "ј7", "rank": 0, "size": 2}}, "register: gang: id: 'ј7' looks like a job")):
        r = ask(daemon, "register", b"new", pid=daemon.stand_in_pid, argv=["python", "t.py"], **fields)
        assert not r["ok"] and said in r["error"], r
    assert not daemon.jobs
    reg = register(daemon, name="old")
    daemon.jobs[reg["job"]].name = "j45"          # as an older gmuxd took it
    back = register(daemon, job=reg["job"], token=reg["token"], name="j45")
    assert back["job"] == reg["job"] and daemon.jobs[reg["job"]].name == "j45"


def test_a_suspend_may_bring_the_jobs_deadline_forward(daemon):
    """A cluster fence's suspend (deadline_s): a job not suspended by then is stopped, however long its own
    mini-batches make its deadline; released, the job's own counts again."""
    a = register(daemon, mem=GiB)
    daemon.tick()
    ask(daemon, "suspend", admin=daemon.admin, job=a["job"], deadline_s=0.5)
    slicer = daemon.slicers[0]
    assert slicer.entries[a["job"]].stop_by == 0.5 and slicer.deadline(a["job"]) == 0.5
    assert ask(daemon, "resume", admin=daemon.admin, job=a["job"])["ok"]
    assert slicer.entries[a["job"]].stop_by is None and slicer.deadline(a["job"]) > 0.5
    with pytest.raises(protocol.ProtocolError, match="suspend.deadline_s"):
        protocol.decode(msgpack.packb({"v": protocol.VERSION, "type": "suspend", "id": 1, "admin": "a", "job": "j1",
                                       "deadline_s": -1}))


def test_a_job_whose_suspend_was_answered_is_shown_held_before_the_next_tick(daemon):
    """The requester hears first: its next question (gmux ps) could be answered before the tick that brought the
    job's state up to date, showing it "suspending" (CI: an e2e test's suspend then ps)."""
    a = register(daemon, mem=GiB)
    daemon.sent.clear()
    daemon.tick()
    (start,) = [m for i, m in daemon.sent if m["type"] == "command"]
    _result(daemon, b"job-a", a, start, state="running")
    daemon.tick()
    assert daemon.jobs[a["job"]].state == "running"
    assert ask(daemon, "suspend", admin=daemon.admin, job=a["job"]) is None
    (stop,) = [m for i, m in daemon.sent if m["type"] == "command"]
    assert daemon.jobs[a["job"]].state != "held"
    (reply,) = _result(daemon, b"job-a", a, stop, state="suspended")
    assert reply["ok"] and daemon.jobs[a["job"]].state == "held"


def test_logs_of_a_gang_by_its_name_are_its_first_ranks_live_or_ended(daemon):
    """`gmux logs NAME` of a gang showed the rank whose id sorted first as text (j10 before j9) while it ran, and
    the newest-created rank once it had ended: rank 1's log as often as rank 0's."""
    for n in range(8):
        register(daemon, b"job-%d" % n)
    ranks = [register(daemon, b"rank-%d" % rank, name="ranks", gang={"id": "g", "rank": rank, "size": 2})["job"]
             for rank in (0, 1)]
    assert ranks == ["j9", "j10"]
    for rank, job_id in enumerate(ranks):
        daemon.jobs[job_id].managed = True
        with open(daemon.rundir.log_file(job_id), "w") as f:
            f.write(f"rank {rank} says\n")
    assert ask(daemon, "logs", admin=daemon.admin, job="ranks")["data"]["text"] == "rank 0 says\n"
    for job_id in ranks:
        daemon.jobs[job_id].state = "exited"
    assert ask(daemon, "logs", admin=daemon.admin, job="ranks")["data"]["text"] == "rank 0 says\n"


def test_a_killed_gangs_name_is_free_once_the_kill_is_answered(daemon, tmp_path):
    """`gmux kill k` answered before the next reap: `gmux submit --name k` straight after was refused "your gang
    'k' has not ended (its rank 0 is j3, waiting)" (CI). No tick runs here between the two."""
    script = tmp_path / "sleeps.py"
    script.write_text("import time\ntime.sleep(600)\n")
    submit = dict(admin=daemon.admin, argv=["python", str(script)], cwd=str(tmp_path), name="k")
    assert ask(daemon, "submit", ranks=2, **submit)["data"]["jobs"] == ["j1", "j2"]
    assert ask(daemon, "kill", admin=daemon.admin, job="k")["data"]["jobs"] == ["j1", "j2"]
    ended = [(daemon.jobs[j].state, daemon.jobs[j].detail) for j in ("j1", "j2")]
    assert ended == [("killed", "killed by gmux kill")] * 2, ended
    again = ask(daemon, "submit", **submit)
    assert again["ok"] and again["data"]["job"] == "j3", again
    assert ask(daemon, "kill", admin=daemon.admin, job="k")["data"]["jobs"] == ["j3"]
    assert daemon.jobs["j3"].final and not daemon.sup.children
