"""A policy that raises does not take gmux-scheduler down: it keeps answering, says what failed, and asks the
policy again at the next event (a Gandiva scheduler once died dividing by zero GPUs per machine while every
machine was briefly down, and the cluster lost its control with it)."""
import threading

from gmux.cluster.policies import make_policy
from gmux.cluster.scheduler.service import Options, Scheduler
from gmux.wire import keys
from gmux.wire.scheduler_client import ClusterClient
from gmux_testkit import wait_for


class Broken:
    name = "broken"

    def __init__(self):
        self.calls = 0

    def decide(self, snap, event):
        self.calls += 1
        raise ZeroDivisionError("integer division or modulo by zero")


def test_a_policy_that_raises_is_logged_and_the_scheduler_serves_on(tmp_path):
    keydir = str(tmp_path / "keys")
    keys.create(keydir, "scheduler")
    keys.create(keydir, "client", "alice")
    s = Scheduler(str(tmp_path / "state"), keydir, Options(listen="tcp://127.0.0.1:*", policy="gandiva", tick=0.1))
    broken = Broken()
    s.driver.policy = broken
    stop = threading.Event()
    t = threading.Thread(target=s.serve, kwargs={"until": stop.is_set}, daemon=True)
    t.start()
    c = ClusterClient(s.endpoint, keydir, "alice", timeout=10.0)
    try:
        cjob = c.call("c_submit", argv=["python", "t.py"], cwd="/")["cjob"]
        failed = wait_for(lambda: [d for d in c.call("c_ps")["decisions"] if d["kind"] == "policy_failed"], 10,
                          "the failure logged")
        assert "ZeroDivisionError" in failed[0]["text"] and "gandiva" in failed[0]["text"]
        wait_for(lambda: broken.calls >= 3, 10, "the policy asked again at later events")
        jobs = {j["cjob"]: j for j in c.call("c_ps")["jobs"]}
        assert jobs[cjob]["state"] == "pending" and t.is_alive()
        s.driver.policy = make_policy("gandiva")      # fixed: the next event decides as usual
        assert c.call("c_kill", cjob=cjob) == {"cjob": cjob}
    finally:
        c.close()
        stop.set()
        t.join(10)
