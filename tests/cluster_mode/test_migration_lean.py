"""A cross-machine move of a job that says its loop overwrites its gradients (GMUX_GRADS=overwritten): the
checkpoint sent leaves them out (a third of this SGD-with-momentum job's bytes) and the job still ends
bit-identical to an uninterrupted run; beside it, the same job without the setting sends them."""
import json

from cluster_harness import PY, ROOT, TRAIN, Solo, paced, unpace, wait_for

# Paced (20 ms a step, 30 s at least for all of them: both moves end in well under that) until both have moved,
# then the rest at full speed: fewer steps than the 6,000 at 3 ms this test once ran, in two jobs and a reference.
STEPS = "1500"


def test_a_move_without_gradients_sends_less_and_stays_bit_identical(cluster_factory, tmp_path):
    c = cluster_factory(policy="gandiva", warm=True)
    args = (STEPS, "--batch", "36", *paced(tmp_path, "0.02"), "--hidden", "256", "--depth", "1")
    ref = Solo(tmp_path, "ref", *args)
    c.wait_machines(3)
    outs, cjobs = {}, {}
    for kind, env in (("full", {}), ("lean", {"GMUX_GRADS": "overwritten"})):
        outs[kind] = tmp_path / f"{kind}.json"
        cjobs[kind] = c.call("c_submit", argv=[PY, TRAIN, str(outs[kind]), *args, "--attach"], cwd=ROOT,
                             env={"OMP_NUM_THREADS": "1", **env})["cjob"]
    sent = {}
    recent = lambda: [d["text"] for d in c.ps()["decisions"][-8:]]
    for kind, cjob in cjobs.items():
        first = wait_for(lambda: (lambda j: j["state"] == "running" and j["step"] > 50 and j)(c.job(cjob)), 60,
                         f"{kind} job running")
        dst = next(m for m in ("m1", "m2", "m3") if m != first["machine"])
        c.call("c_migrate", cjob=cjob, machine=dst, gpu=1)
        wait_for(lambda: c.job(cjob)["migrations"] == 1, 120, lambda: f"{kind} job moved: {c.job(cjob)} {recent()}")
        sent[kind] = next(d["numbers"] for d in c.ps()["decisions"]
                          if d["kind"] == "migrate_sent" and d["text"].startswith(f"{cjob}:"))
    unpace(tmp_path)
    jobs = c.wait_done(list(cjobs.values()), 300)
    for kind, cjob in cjobs.items():
        res = json.loads(outs[kind].read_text())
        assert res["sha256"] == ref["sha256"] and res["steps"] == int(STEPS), kind
        assert res["restored_at"] > 0 and jobs[cjob]["migrations"] == 1, kind
    # weights, gradients and momentum are the same size: the gradients are a third of the data (a little less
    # of the whole, with the format's own bytes)
    assert 0.3 < 1 - sent["lean"]["bytes"] / sent["full"]["bytes"] < 1 / 3, sent
    assert sent["lean"]["running_s"] >= 0 and sent["full"]["running_s"] >= 0
