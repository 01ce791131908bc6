"""gmux-scheduler with three real gmuxd daemons on loopback: jobs placed by a policy run to completion
bit-identical to solo runs; strangers and wrong keys are refused; malformed daemon messages cost nothing;
a scheduler killed mid-run and restarted loses no job."""
import contextlib
import json
import os
import random
import signal
import sqlite3
import subprocess
import time

import msgpack
import zmq

from gmux import protocol
from gmux.cluster.scheduler import unheard
from gmux.wire import keys
from gmux.wire.scheduler_client import ClusterClient, ClusterError
from cluster_harness import PY, ROOT, TRAIN, env, Solo, paced, unpace, wait_for

STEPS = "1500"


def _outputs(tmp_path, names):
    return {n: json.loads((tmp_path / f"{n}.json").read_text()) for n in names}


def test_gandiva_places_on_three_daemons_bit_identical_and_refuses_strangers(cluster_factory, tmp_path):
    c = cluster_factory(policy="gandiva")
    # The jobs are paced (10 ms a step, 15 s at least) so that on a fast machine they still run when one is
    # held; pacing changes no weight, so the solo references run unpaced.
    refs = {b: Solo(tmp_path, b, STEPS, "--batch", b) for b in ("30", "31", "32", "33")}
    pace = paced(tmp_path, "0.01")
    c.wait_machines(3)
    ids = {b: c.submit(str(tmp_path / f"j{b}.json"), STEPS, "--batch", b, *pace) for b in refs if b != "33"}
    r = subprocess.run([PY, "-m", "gmux.cli.gmux", "--json", "submit", "--cluster", c.endpoint, "--keys", c.keys,
                        "--as", "tester", "--", PY, TRAIN, str(tmp_path / "j33.json"), STEPS, "--batch", "33",
                        *pace, "--attach"], env=env(), capture_output=True, text=True, cwd=ROOT, timeout=30)
    assert r.returncode == 0, r.stderr
    ids["33"] = json.loads(r.stdout)["cjob"]
    # no --ckpt-every: the scheduler's own default applies (the CLI used to send "never")
    with contextlib.closing(sqlite3.connect(tmp_path / "sched" / "scheduler.db")) as db:
        (every,) = db.execute("SELECT ckpt_every FROM jobs WHERE cjob=?", (ids["33"],)).fetchone()
    assert every == 30.0, every

    # --- refusals, while the jobs run ---
    ctx = zmq.Context.instance()
    plain = ctx.socket(zmq.DEALER)                       # no CurveZMQ at all
    plain.setsockopt(zmq.LINGER, 0)
    plain.connect(c.endpoint)
    plain.send(protocol.encode("c_ps", 1, table=protocol.CLUSTER_MESSAGES))
    assert not plain.poll(1000), "a client without a key got an answer"
    plain.close(0)
    stranger = str(tmp_path / "stranger-keys")
    keys.create(stranger, "client", "tester")            # same name, a key the cluster never authorised
    for f in ("scheduler.pub",):
        open(os.path.join(stranger, f), "w").write(open(os.path.join(c.keys, f)).read())
    try:
        ClusterClient(c.endpoint, stranger, "tester", timeout=1.0).call("c_ps")
        raise AssertionError("a wrong key got an answer")
    except ClusterError as e:
        assert "did not answer" in str(e)
    # A client key cannot speak for a machine.
    cl = c.client()
    try:
        cl.call("node_report", name="m1", gpus=[], transfer="tcp://127.0.0.1:9", jobs=[])
        raise AssertionError("a client key was taken for a daemon")
    except ClusterError as e:
        assert "not accepted from a client key" in str(e)
    cl.close()

    # --- malformed messages from an authorised daemon key ---
    keys.create(c.keys, "daemon", "rogue")
    rogue = keys.client_socket(ctx, zmq.DEALER, c.keys, "daemon", "rogue", keys.load_public(c.keys, "scheduler"))
    rogue.setsockopt(zmq.IDENTITY, b"rogue")
    rogue.setsockopt(zmq.LINGER, 0)
    rogue.connect(c.endpoint)
    rnd = random.Random(7)
    good = {"v": 1, "type": "node_report", "id": 3, "name": "rogue", "gpus": [{"index": 0, "mem_total": 1}],
            "transfer": "tcp://127.0.0.1:9", "jobs": []}
    frames = [[b"\xc1garbage"], [msgpack.packb([1, 2])], [msgpack.packb({**good, "v": 9})],
              [msgpack.packb({**good, "name": "m1"})],                   # names another machine
              [msgpack.packb({**good, "jobs": [{"cjob": "c1"}]})],      # a job record missing fields
              [msgpack.packb({**good, "gpus": "x" * 100})],
              [msgpack.packb({**good, "transfer": "ipc:///tmp/x"})],
              [msgpack.packb({"v": 1, "type": "xfer_chunk", "id": 4, "xfer": "m1-c1-k1", "offset": 0}), b"x"],
              [msgpack.packb({"v": 1, "type": "node_event", "id": 5, "name": "rogue", "cjob": "c999", "event": "started"})],
              [msgpack.packb({"v": 1, "type": "c_submit", "id": 6, "argv": ["x"], "cwd": "/"})],   # not a client
              [b"a", b"b", b"c"]]
    for _ in range(300):
        obj = {k: rnd.choice([None, -1, 2 ** 64 - 1, "", "x" * 5000, [], {}, 1.5, True]) if rnd.random() < 0.3 else v
               for k, v in good.items()}
        obj[rnd.choice(sorted(good))] = "x" * 5000     # at least one field that no message type accepts
        frames.append([msgpack.packb(obj)])
    for f in frames:
        rogue.send_multipart(f)
    replies = 0
    deadline = time.monotonic() + 60            # (a loaded scheduler may pause between replies)
    while replies < len(frames) and rogue.poll(max(0, int((deadline - time.monotonic()) * 1000))):
        msg = protocol.decode(rogue.recv(), protocol.CLUSTER_MESSAGES)
        replies += 1
        assert msg.type == "reply" and not msg.get("ok"), msg
    assert replies == len(frames)
    rogue.close(0)
    ps = c.ps()
    assert ps["internal_errors"] == 0 and ps["bad_messages"] >= len(frames)
    assert "rogue" not in {m["name"] for m in ps["machines"]}

    # --- its user holds a job (the CLI): it stays suspended past the grace after which the scheduler says
    #     again what a machine did not do, then runs on once released ---
    def cli(*args):
        r = subprocess.run([PY, "-m", "gmux.cli.gmux", *args[:1], "--cluster", c.endpoint, "--keys", c.keys,
                            "--as", "tester", *args[1:]], env=env(), capture_output=True, text=True, cwd=ROOT,
                           timeout=30)
        # (the policy may be moving it this moment: a hold waits until it runs at its new place)
        return r.stdout if r.returncode == 0 else None if "hold it once it runs there" in r.stderr else r.stderr
    live = sorted((j["step"], j["cjob"]) for j in c.ps()["jobs"] if j["cjob"] in ids.values() and not j["exit_status"]
                  and j["state"] in ("running", "suspended", "pending", "starting"))
    assert live, "every job ended before one could be held"
    held = live[0][1]
    out = wait_for(lambda: cli("suspend", held), 60, "a hold taken")
    assert "held until" in out, out

    def stopped():
        before = c.job(held)["step"]
        time.sleep(2.0)
        now = c.job(held)
        return now if now["step"] == before else None
    step = wait_for(stopped, 60, "the held job stopped")["step"]
    time.sleep(unheard.GRACE_S + 1.5)
    job = c.job(held)
    assert job["state"] == "held" and job["step"] == step and "held by tester" in job["detail"], job
    assert "released" in cli("resume", held)
    # --- every job completes, bit-identical to its solo run ---
    unpace(tmp_path)
    jobs = c.wait_done(list(ids.values()), 180)
    used = {jobs[i]["machine"] for i in ids.values()}
    assert len(used) >= 2, f"the policy spread nothing: {used}"
    for b, cjob in ids.items():
        out = json.loads((tmp_path / f"j{b}.json").read_text())
        assert out["sha256"] == refs[b]["sha256"] and out["steps"] == int(STEPS), (b, out, refs[b])
    # The CLI against the cluster.
    r = subprocess.run([PY, "-m", "gmux.cli.gmux", "ps", "--cluster", c.endpoint, "--keys", c.keys, "--as", "tester"],
                       env=env(), capture_output=True, text=True, cwd=ROOT, timeout=30)
    assert r.returncode == 0, r.stderr
    assert "policy gandiva" in r.stdout and sum(" done " in line for line in r.stdout.splitlines()) == len(ids)


def test_gmux_policy_scheduler_killed_and_restarted_loses_nothing(cluster_factory, tmp_path):
    c = cluster_factory(policy="gmux")
    # Long enough that all three still run when the scheduler is killed: two start in warm interpreters, the
    # third (two on one machine) cold, seconds later on a busy machine.
    steps = "2500"
    refs = {b: Solo(tmp_path, b, steps, "--batch", b, *paced(tmp_path, "0.006"))
            for b in ("40", "41", "42")}
    c.wait_machines(3)
    ids = {b: c.submit(str(tmp_path / f"j{b}.json"), steps, "--batch", b, *paced(tmp_path, "0.006"))
           for b in refs}
    wait_for(lambda: all(j["state"] == "running" and j["step"] > 50 for j in c.ps()["jobs"]), 60, "all running")
    c.sched.send_signal(signal.SIGKILL)
    c.sched.wait()
    # A checkpoint no job's bookkeeping names (received just before the kill): the restarted scheduler drops it.
    stray = tmp_path / "sched" / "checkpoints" / f"m1-{ids['40']}-k99.0.ckpt"
    stray.write_bytes(b"x" * 100)
    time.sleep(1.0)
    c.start_scheduler()
    assert not stray.exists()
    ps = c.ps()
    assert {j["cjob"] for j in ps["jobs"]} == set(ids.values())
    # Its view comes back from SQLite and the daemons' next reports, without starting anything again.
    wait_for(lambda: all(j["state"] in ("running", "done") for j in c.ps()["jobs"]), 10, "jobs seen running")
    unpace(tmp_path)
    jobs = c.wait_done(list(ids.values()), 180)
    assert all(jobs[i]["restarts"] == 0 for i in ids.values())      # nothing was restarted: nothing was lost
    for b in refs:
        out = json.loads((tmp_path / f"j{b}.json").read_text())
        assert out["sha256"] == refs[b]["sha256"], b
    assert "recovered 3 live jobs" in (tmp_path / "scheduler.log").read_text()
