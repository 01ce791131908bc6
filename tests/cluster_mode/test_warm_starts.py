"""Cluster starts in warm interpreters (gmux.node.warm_pool): a move's target runs in the interpreter its
machine had ready, torch imported, and the job still ends bit-identical; a start whose environment differs in
what is read before a script runs gets a cold process, and says why."""
import json
import re

from cluster_harness import PY, ROOT, TRAIN, Solo, paced, unpace, wait_for

STEPS = "4000"


def _started(c, m: str, cjob: str) -> list:
    text = (c.tmp / f"gmuxd-{m}.log").read_text(errors="replace")
    return re.findall(rf"started {cjob} \(pids \[(\d+)\], ([^)]*)\)", text)


def test_a_moved_job_restores_in_a_warm_interpreter_and_an_odd_environment_starts_cold(cluster_factory, tmp_path):
    c = cluster_factory(policy="gandiva", machines=("m1", "m2"), warm=True)
    args = (STEPS, "--batch", "36", *paced(tmp_path, "0.003"), "--hidden", "128", "--depth", "1")
    ref = Solo(tmp_path, "ref", *args)
    c.wait_machines(2)
    out = tmp_path / "moved.json"
    cjob = c.call("c_submit", argv=[PY, TRAIN, str(out), *args, "--attach"], cwd=ROOT,
                  env={"OMP_NUM_THREADS": "1"})["cjob"]
    first = wait_for(lambda: (lambda j: j["state"] == "running" and j["step"] > 200 and j)(c.job(cjob)), 60,
                     "the job running")
    dst = "m2" if first["machine"] == "m1" else "m1"
    c.call("c_migrate", cjob=cjob, machine=dst, gpu=0)
    wait_for(lambda: c.job(cjob)["migrations"] == 1, 120, lambda: f"the job moved: {c.job(cjob)}")
    odd = tmp_path / "odd.json"
    other = c.call("c_submit", argv=[PY, TRAIN, str(odd), "40", "--attach"], cwd=ROOT,
                   env={"OMP_NUM_THREADS": "2"})["cjob"]
    unpace(tmp_path)
    c.wait_done([cjob, other], 300)
    res = json.loads(out.read_text())
    assert res["sha256"] == ref["sha256"] and res["steps"] == int(STEPS) and res["restored_at"] > 0
    # The process that finished the job is the warm interpreter its target's link handed the start to.
    (pid, how), = _started(c, dst, cjob)
    assert how == "warm" and int(pid) == res["pid"], _started(c, dst, cjob)
    # The other job's OMP_NUM_THREADS is read when torch loads its OpenMP runtime: no warm interpreter fits.
    starts = [s for m in ("m1", "m2") for s in _started(c, m, other)]
    assert len(starts) == 1 and starts[0][1].startswith("cold: its environment differs") \
        and "OMP_NUM_THREADS" in starts[0][1], starts
    assert int(starts[0][0]) == json.loads(odd.read_text())["pid"]
