"""Cross-machine moves of a job most of whose bytes are frozen (demo_train --frozen-mib: an embedding table that
training leaves alone, built alike by every process): the move's new process offers what it holds, the source
leaves it out of the stream (gmux.job.holdings), and the job still ends bit-identical to an uninterrupted run;
a second move, from the process that was restored, leaves it out again."""
import json

from cluster_harness import PY, ROOT, TRAIN, Solo, paced, unpace, wait_for
from gmux.wire import sealed

STEPS = "6000"   # ~30 s paced: two moves fit even when a loaded machine starts each target in ~10 s
FROZEN_MIB = 8


def test_moves_leave_out_what_the_target_holds_and_stay_bit_identical(cluster_factory, tmp_path):
    c = cluster_factory(policy="gandiva")
    # (at demo_train's own learning rate this one diverged by step 80, and every run hashed the same NaNs)
    args = (STEPS, "--batch", "16", "--hidden", "64", "--frozen-mib", str(FROZEN_MIB), "--lr", "0.001")
    ref = Solo(tmp_path, "ref", *args)        # (unpaced: the pause between mini-batches changes no number)
    args += tuple(paced(tmp_path, "0.005"))     # (long enough for two moves, each waiting for its target's start-up)
    c.wait_machines(3)
    out = tmp_path / "moved.json"
    cjob = c.call("c_submit", argv=[PY, TRAIN, str(out), *args, "--attach"], cwd=ROOT,
                  env={"OMP_NUM_THREADS": "1"})["cjob"]
    recent = lambda: [d["text"] for d in c.ps()["decisions"][-8:]]
    sent = []
    for move in (1, 2):
        job = wait_for(lambda: (lambda j: j["state"] == "running" and j["step"] > 150 * move and j)(c.job(cjob)),
                       60, f"job running before move {move}")
        dst = next(m for m in ("m1", "m2", "m3") if m != job["machine"])
        c.call("c_migrate", cjob=cjob, machine=dst, gpu=1)
        wait_for(lambda: c.job(cjob)["migrations"] == move, 120, lambda: f"move {move}: {c.job(cjob)} {recent()}")
        sent.append([d["numbers"] for d in c.ps()["decisions"]
                     if d["kind"] == "migrate_sent" and d["text"].startswith(f"{cjob}:")][-1])
    unpace(tmp_path)
    c.wait_done([cjob], 300)
    res = json.loads(out.read_text())
    assert res["sha256"] == ref["sha256"] and res["steps"] == int(STEPS)
    assert res["restored_at"] > 0
    # the table is FROZEN_MIB of the checkpoint; what else the job holds (a 64-wide net, its momentum) is
    # a few hundred KiB
    for figures in sent:
        assert figures["bytes"] < 1 << 20, sent
        # the chunks went sealed beside CurveZMQ (gmux.wire.sealed), every one of them
        assert figures["sealed_bytes"] >= figures["bytes"] or not sealed.available(), sent
