"""A 2-rank gloo job under gmuxd: suspended and resumed as a gang (both ranks at the same step, though the two
suspend requests reach them at different times), bit-identical to an uninterrupted run."""
import json
import os
import subprocess
import threading
import time

from gmux.wire.daemon_client import Client
from cluster_harness import PY, ROOT, env, free_port, paced, unpace, wait_for

GANG = os.path.join(ROOT, "tests", "scripts", "gang_train.py")
# A gang's step costs each rank ~1.3 ms of CPU: the gang is paced (20 ms a step, 10 s at least for the 500, where
# 2,000 unpaced steps had a few) until both suspends are over, then runs the rest at full speed.
STEPS = "500"


def _ranks(tmp_path, tag, prefix=(), extra=()):
    port = free_port()
    return [subprocess.Popen([*prefix, PY, GANG, str(tmp_path / f"{tag}{r}.json"), STEPS, "--rank", str(r),
                              "--world", "2", "--port", str(port), *extra], env=env(), cwd=ROOT, stdout=open(tmp_path / f"{tag}{r}.log", "ab"),
                             stderr=subprocess.STDOUT) for r in range(2)]


def test_gloo_gang_suspends_and_resumes_at_one_step_bit_identical(tmp_path):
    ref = _ranks(tmp_path, "plain", extra=("--plain",))        # (beside the gang; waited for at the end)
    rt = str(tmp_path / "rt")
    # The ranks are two jobs to gmuxd: rank 0, told first, reaches its boundary only once rank 1 is told too.
    # Past its deadline gmuxd would stop it (SIGSTOP), which is not what this test is about; on a loaded machine
    # the 1 s default can pass before rank 1's request is through.
    d = subprocess.Popen([PY, "-m", "gmux.cli.gmuxd", "--runtime-dir", rt, "--virtual-gpus", "2x2GiB",
                          "--deadline-floor", "30"], env=env(),
                         cwd=ROOT, stdout=open(tmp_path / "gmuxd.log", "ab"), stderr=subprocess.STDOUT)
    procs = []
    try:
        wait_for(lambda: os.path.exists(os.path.join(rt, "gmuxd.sock")), 30, "gmuxd up")
        time.sleep(0.5)
        procs = [subprocess.Popen([PY, "-m", "gmux.cli.launch", "--runtime-dir", rt, "--no-hook", "--gpu", str(r),
                                   "--name", f"rank{r}", "--", "python", GANG, str(tmp_path / f"gang{r}.json"), STEPS,
                                   "--rank", str(r), "--world", "2", "--port", str(port), *paced(tmp_path, "0.02")],
                                  env=env(), cwd=ROOT, start_new_session=True,
                                  stdout=open(tmp_path / f"gang{r}.log", "ab"), stderr=subprocess.STDOUT)
                 for port in [free_port()] for r in range(2)]
        c = Client(rt, timeout=60)
        jobs = wait_for(lambda: (lambda js: len(js) == 2 and all(j["step"] > 50 for j in js) and js)(
            [j for j in c.call("ps", all=True)["jobs"] if j["name"].startswith("rank")]), 60, "both ranks running")
        ids = {j["name"]: j["id"] for j in jobs}
        for cycle in range(2):
            # The gang's two suspend requests, 0.3 s apart: rank 0 must wait for rank 1 rather than stop alone.
            done = {}

            def suspend(name):
                done[name] = Client(rt, timeout=60).call("suspend", timeout=60, job=ids[name])
            t0 = threading.Thread(target=suspend, args=("rank0",))
            t0.start()
            time.sleep(0.3)
            suspend("rank1")
            t0.join(60)
            assert set(done) == {"rank0", "rank1"}
            # ps may lag the replies by a tick; on failure, each rank's reply and state say what happened (a rank
            # past its deadline on a loaded machine is stopped, and its reply says so)
            states = lambda: {j["name"]: j["state"] for j in c.call("ps", all=True)["jobs"] if j["name"] in ids}
            wait_for(lambda: all(s in ("held", "suspended") for s in states().values()), 60,
                     lambda: f"both ranks suspended (replies {done}, states {states()})")
            time.sleep(1.0)
            for name in ids:
                c.call("resume", job=ids[name])
        unpace(tmp_path)
        assert [p.wait(180) for p in procs] == [0, 0]
        assert [p.wait(120) for p in ref] == [0, 0]
    finally:
        for p in procs + ref:
            if p.poll() is None:
                p.kill()
        d.kill()
        d.wait()
    outs = [json.loads((tmp_path / f"gang{r}.json").read_text()) for r in range(2)]
    plain = [json.loads((tmp_path / f"plain{r}.json").read_text()) for r in range(2)]
    assert outs[0]["sha256"] == outs[1]["sha256"] == plain[0]["sha256"] == plain[1]["sha256"]
    assert outs[0]["suspends"] == outs[1]["suspends"] == 2
    # Both ranks carried out each suspend at the same boundary.
    assert outs[0]["agreed"] == outs[1]["agreed"] and [k for k, _ in outs[0]["agreed"]] == ["suspend", "suspend"]
