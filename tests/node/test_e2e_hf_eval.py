"""End to end: a Hugging Face Trainer that evaluates after every step (eval_steps=1, and at its start, on two
eval datasets drawing noise from torch's random stream as its training data does), and one that also saves its
own checkpoint at every step, get a boundary once that work is over: under gmux-launch each is suspended, resumed and moved to a new
process there, and ends bit-identical to its solo run, with the same losses at every evaluation and the same
checkpoints of its own."""
import importlib.util
import os

import pytest

from node_harness import ROOT, Node, paced, result, start_py, unpace

HF = os.path.join(ROOT, "tests", "scripts", "hf_trainer.py")
# 2 epochs of 8 steps (16 points each, in micro-batches of 8), each step then evaluated on 32 and 16 points;
# every micro-batch, evaluated or trained on, waits 50 ms in the collator (no number changes) until it has moved
ARGS = ["--epochs", "2", "--samples", "128", "--eval-steps", "1"]
pytestmark = pytest.mark.skipif(importlib.util.find_spec("transformers") is None,
                                reason="transformers not installed (pip install -e .[test])")


def _past(node, job, step):
    def there():
        info = node.job(job)
        return info if (info.get("report") or {}).get("control") == "framework" and info["step"] > step else None
    return node.wait_for(there, 120, f"the Trainer under gmux past step {step}")


@pytest.mark.parametrize("saves", [False, True], ids=["evaluating", "evaluating-and-saving"])
def test_a_trainer_at_work_after_every_step_is_suspended_and_moved_after_it_bit_identical(tmp_path, saves):
    args = ARGS + paced(tmp_path, "0.05") + (["--save-steps", "1"] if saves else [])
    solo = start_py(HF, str(tmp_path / "solo.json"), *args, log=str(tmp_path / "solo.log"))
    node = Node(tmp_path, "--virtual-gpus", "2x1GiB", "--deadline-floor", "20")
    try:
        p = node.launch(HF, str(tmp_path / "moved.json"), *args, opts=["--gpu", "0"], log_name="moved.log")
        job = node.job_of(p.pid, 60)
        info = _past(node, job, 2)
        assert info["report"]["movable"], info["report"]
        node.call("suspend", job=job)
        held = node.job(job)
        assert held["state"] == "held" and held["step"] < 16, held       # (before: no boundary, so a stop)
        node.call("resume", job=job)
        _past(node, job, held["step"])
        node.call("migrate", job=job, gpu=1, new_process=True)      # (answered once its checkpoint is written)
        unpace(tmp_path)
        assert p.wait(300) == 0, (tmp_path / "moved.log").read_text()[-3000:]
        assert solo.wait(300) == 0, (tmp_path / "solo.log").read_text()[-3000:]
        info = node.job(job)
        assert info["migrations"] == 1 and info["suspends"] >= 1 and info["gpu"] == 1, info
    finally:
        node.close()
        if solo.poll() is None:
            solo.kill()
    moved, alone = result(tmp_path / "moved.json"), result(tmp_path / "solo.json")
    assert moved["first_step"] > held["step"] and moved["global_step"] == alone["global_step"] == 16, (moved, alone)
    # both datasets at the start (not again in the restored process) and after each of the 16 steps
    assert [step for step, *_ in alone["evals"]] == [n for n in range(17) for _ in "ab"], alone
    assert moved["evals"] == alone["evals"], (moved, alone)
    assert moved["sha256"] == alone["sha256"] and moved["totals"] == alone["totals"], (moved, alone)
    if saves:
        kept = lambda name: sorted(os.listdir(tmp_path / f"{name}.json-checkpoints"))
        assert kept("moved") == kept("solo") == [f"checkpoint-{n}" for n in sorted(range(1, 17), key=str)]
