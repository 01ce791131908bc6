"""End to end: a Trainer loading its data in worker processes moves to a new process and ends bit-identical to its
solo run when nothing its workers run draws random numbers (Hugging Face with workers; Lightning with persistent
workers, moved in an epoch after the one they started in, its module freezing a layer at that epoch's start);
when its dataset or collate function draws (noise added in the workers), the move is refused with the reason and
the job finishes where it is.
"""
import importlib.util
import os

import pytest

from gmux.wire.daemon_client import GmuxError
from node_harness import ROOT, Node, result, start_py

SCRIPTS = os.path.join(ROOT, "tests", "scripts")
# 4 epochs of 32 batches of 8, two per optimizer step: 64 steps; each batch waits 100 ms in a worker
CASES = {
    "huggingface": ("transformers", os.path.join(SCRIPTS, "hf_trainer.py"), ["--workers", "2"], 0,
                    "worker processes draw random numbers as its dataset is indexed"),
    # moved once it is past its first epoch (15 boundaries: none at an epoch's last batch)
    # (and its module freezes a layer from epoch 1 on, in on_train_epoch_start, which Lightning's resume skips)
    "lightning": ("lightning", os.path.join(SCRIPTS, "lightning_train.py"),
                  ["--workers", "2", "--persistent", "--freeze-from-epoch", "1"], 20,
                  "persistent_workers=True, and its dataset or collate function draws"),
}
ARGS = ["--epochs", "4", "--samples", "256", "--sleep", "0.1"]


def _at_step(node: Node, job: str, step: int) -> dict:
    def there():
        info = node.job(job)
        return info if (info.get("report") or {}).get("control") == "framework" and info["step"] > step else None
    return node.wait_for(there, 120, f"the Trainer under gmux past step {step}")


@pytest.mark.parametrize("name", list(CASES))
def test_loader_workers_that_draw_nothing_move_exactly_and_drawing_ones_are_refused(tmp_path, name):
    module, script, workers, step, refusal = CASES[name]
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} not installed (pip install -e .[test])")
    solo = start_py(script, str(tmp_path / "solo.json"), *ARGS, *workers, "--no-noise", log=str(tmp_path / "solo.log"))
    node = Node(tmp_path, "--virtual-gpus", "2x1GiB")
    try:
        quiet = node.launch(script, str(tmp_path / "quiet.json"), *ARGS, *workers, "--no-noise", opts=["--gpu", "0"],
                            log_name="quiet.log")
        job = node.job_of(quiet.pid, 60)
        info = _at_step(node, job, step)
        assert info["report"]["movable"], info["report"]      # (running, or resuming from a turn: moved at once)
        node.call("migrate", job=job, gpu=1, new_process=True)
        assert quiet.wait(300) == 0, (tmp_path / "quiet.log").read_text()[-3000:]
        assert solo.wait(300) == 0, (tmp_path / "solo.log").read_text()[-3000:]
        moved, alone = result(tmp_path / "quiet.json"), result(tmp_path / "solo.json")
        assert moved["first_step"] > step and node.job(job)["migrations"] == 1, (moved, node.job(job))
        assert moved["global_step"] == alone["global_step"] == 64
        assert moved["sha256"] == alone["sha256"], (moved, alone)

        noisy = node.launch(script, str(tmp_path / "noisy.json"), *ARGS, *workers, opts=["--gpu", "0"],
                            log_name="noisy.log")
        job = node.job_of(noisy.pid, 60)
        info = _at_step(node, job, 0)
        assert not info["report"]["movable"] and info["report"]["unmovable"], info["report"]
        with pytest.raises(GmuxError, match=refusal):
            node.call("migrate", job=job, gpu=1, new_process=True)
        assert noisy.wait(300) == 0, (tmp_path / "noisy.log").read_text()[-3000:]
        assert result(tmp_path / "noisy.json")["first_step"] == 0 and node.job(job)["migrations"] == 0
    finally:
        node.close()
        if solo.poll() is None:
            solo.kill()
