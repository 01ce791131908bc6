"""The job's agent against a bare ROUTER standing in for gmuxd: what it sends, in which order."""
import zmq

from gmux import protocol
from gmux.job.agent import Agent


def _next(router: zmq.Socket) -> protocol.Message:
    assert router.poll(5000), "the agent sent nothing"
    return protocol.decode(router.recv_multipart()[1])


def _pair(tmp_path):
    """A bare ROUTER standing in for gmuxd, and an agent connected to it."""
    router = zmq.Context.instance().socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    endpoint = f"ipc://{tmp_path}/gmuxd.sock"
    router.bind(endpoint)
    return router, Agent(endpoint, job="j1", token="0" * 32)


def test_a_command_at_a_boundary_is_answered_before_the_rate_sample_is_sent(tmp_path):
    router, agent = _pair(tmp_path)
    try:
        agent.state = "running"
        agent.report({"step": 0})    # tells the router the agent's identity
        assert router.poll(5000)
        identity, frame = router.recv_multipart()
        assert protocol.decode(frame).type == "report"
        router.send_multipart([identity, protocol.encode(
            "command", 0, cmd=7, kind="checkpoint", args={"path": str(tmp_path / "c.ckpt")})])
        assert agent.sock.poll(5000)

        command = agent.poll()       # the first boundary: a sample is due, and a command is waiting
        assert (command.kind, command.id) == ("checkpoint", 7)
        agent.reply(command, {"ok": True})
        first = _next(router)
        assert first.type == "result" and first["cmd"] == 7
        assert not router.poll(100), "a rate sample went out at the command's boundary"

        assert agent.poll() is None  # the next boundary sends the sample held back
        sample = _next(router)
        assert sample.type == "heartbeat" and sample["boundaries"] == 2 and sample["state"] == "running"
    finally:
        agent.close()
        router.close()


def test_a_job_suspended_in_place_says_it_runs_while_it_waits(tmp_path):
    # It holds its GPU memory: a daemon restarted meanwhile must count that memory (the slicer's "running").
    router, agent = _pair(tmp_path)
    try:
        agent.state = "running"
        agent.report({"step": 0})
        assert router.poll(5000)
        identity, _ = router.recv_multipart()
        said = []
        for cmd, kind, args, result in [(1, "suspend", {"in_place": True}, {"ok": True, "in_place": True}),
                                        (2, "suspend", {}, {"ok": True, "bytes": 8})]:
            router.send_multipart([identity, protocol.encode("command", 0, cmd=cmd, kind=kind, args=args)])
            agent.reply(agent.wait(timeout=5), result)
            answer = _next(router)
            assert agent.wait(timeout=1.1) is None       # waits, with a heartbeat, for the next command
            beat = _next(router)
            said.append((answer["state"], beat.type, beat["state"]))
        assert said == [("running", "heartbeat", "running"), ("suspended", "heartbeat", "suspended")]
    finally:
        agent.close()
        router.close()


def test_a_job_gmuxd_no_longer_knows_registers_again_where_it_runs_and_takes_a_refusal_once(tmp_path, capfd):
    """A gmuxd restarted over a lost table answers the job's messages "unknown": the job registers again with
    what it registered with, its state and the GPU it was last resumed on (gmux/node/adoption.py)."""
    import threading
    router, agent = _pair(tmp_path)
    agent.job = agent.token = None
    seen = []

    def answer(reply):       # gmuxd's answer to the one request the agent waits on
        identity, frame = router.recv_multipart()
        seen.append(protocol.decode(frame))
        router.send_multipart([identity, protocol.reply(seen[-1].id, **reply)])

    def serving(reply):
        server = threading.Thread(target=answer, args=(reply,))
        server.start()
        return server
    try:
        server = serving({"ok": True, "data": {"job": "j1", "token": "0" * 32, "gpu": None}})
        agent.register(pid=1234, argv=["python", "t.py"], mem=5, name="n")
        server.join(10)
        agent.state = "running"
        agent.report({"step": 0})
        assert router.poll(5000)
        identity, _ = router.recv_multipart()
        router.send_multipart([identity, protocol.encode("command", 0, cmd=1, kind="resume", args={"gpu": 1})])
        assert agent.sock.poll(5000)
        assert agent.poll().kind == "resume"
        for _ in range(2):      # two "unknown" replies: one adoption, refused, and no second try
            router.send_multipart([identity, protocol.error_reply(0, "heartbeat: unknown job 'j1'", unknown=True)])
        server = serving({"ok": False, "error": "register: j1 ... cannot be taken back"})
        assert agent.sock.poll(5000)
        agent.poll()
        server.join(10)
        again = seen[1]
        assert again.type == "register" and (again["job"], again["token"]) == ("j1", "0" * 32)
        assert (again["adopt"], again["on_gpu"], again["argv"], again["mem"], again["name"]) == \
            ("running", 1, ["python", "t.py"], 5, "n")
        agent.poll()
        assert "did not take it back" in capfd.readouterr().err
        while router.poll(300):
            assert protocol.decode(router.recv_multipart()[1]).type != "register"
    finally:
        agent.close()
        router.close()


def test_a_gang_rank_or_a_job_of_several_gpus_is_not_offered_for_adoption(tmp_path, capfd, monkeypatch):
    """A submitted rank registers with nothing but its id (gmuxd knew the rest): its environment says what it is."""
    for var, value, why in (("WORLD_SIZE", "2", "a gang rank"), ("GMUX_VIRTUAL_GPU", "0,1", "several GPUs")):
        router, agent = _pair(tmp_path)
        monkeypatch.setenv(var, value)
        try:
            agent._registration = {"pid": 1234, "argv": ["python", "t.py"]}
            agent.state = "running"
            agent.report({"step": 0})
            identity, _ = router.recv_multipart()
            router.send_multipart([identity, protocol.error_reply(0, "report: unknown job 'j1'", unknown=True)])
            assert agent.sock.poll(5000)
            agent.poll()
            assert why in capfd.readouterr().err
            while router.poll(300):
                assert protocol.decode(router.recv_multipart()[1]).type != "register"
        finally:
            monkeypatch.delenv(var)
            agent.close()
            router.close()


def test_a_job_that_never_started_and_is_not_taken_back_ends_instead_of_waiting_for_ever(tmp_path):
    import threading

    import pytest

    from gmux.job.agent import DaemonUnavailable
    router, agent = _pair(tmp_path)
    try:
        agent._registration = {"pid": 1234, "argv": ["python", "t.py"]}
        agent.report({"step": 0})        # (still "waiting": its start has not come)
        identity, _ = router.recv_multipart()
        router.send_multipart([identity, protocol.error_reply(0, "report: unknown job 'j1'", unknown=True)])

        def refuse():
            ident, frame = router.recv_multipart()
            router.send_multipart([ident, protocol.reply(protocol.decode(frame).id, ok=False,
                                                         error="register: j1 cannot be taken back")])
        server = threading.Thread(target=refuse)
        server.start()
        with pytest.raises(DaemonUnavailable, match="it never started"):
            agent.wait(timeout=10)
        server.join(10)
    finally:
        agent.close()
        router.close()
