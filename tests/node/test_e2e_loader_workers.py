"""End to end: a Trainer loading its data in worker processes moves to a new process and ends bit-identical to its
solo run when nothing its workers run draws random numbers (Hugging Face with workers; Lightning with persistent
workers, moved in an epoch after the one they started in, its module freezing a layer at that epoch's start);
when its dataset or collate function draws (noise added in the workers), the move is refused with the reason and
the job finishes where it is, except Lightning's persistent workers in the epoch they start in, where the move is
exact and only a later one is refused.
"""
import importlib.util
import os

import pytest

from gmux.wire.daemon_client import GmuxError
from node_harness import ROOT, Node, paced, result, start_py, unpace

SCRIPTS = os.path.join(ROOT, "tests", "scripts")
# 4 epochs of 32 batches of 8, two per optimizer step: 64 steps; each batch waits 100 ms in a worker until the
# test has seen what it tests of a run
CASES = {
    "huggingface": ("transformers", os.path.join(SCRIPTS, "hf_trainer.py"), ["--workers", "2"], 0,
                    "worker processes draw random numbers as its dataset is indexed", False),
    # moved once it is past its first epoch (15 boundaries: none at an epoch's last batch)
    # (and its module freezes a layer from epoch 1 on, in on_train_epoch_start, which Lightning's resume skips)
    "lightning": ("lightning", os.path.join(SCRIPTS, "lightning_train.py"),
                  ["--workers", "2", "--persistent", "--freeze-from-epoch", "1"], 20,
                  "persistent_workers=True, and its dataset or collate function draws", True),
}
ARGS = ["--epochs", "4", "--samples", "256"]


def _at_step(node: Node, job: str, step: int) -> dict:
    def there():
        info = node.job(job)
        return info if (info.get("report") or {}).get("control") == "framework" and info["step"] > step else None
    return node.wait_for(there, 120, f"the Trainer under gmux past step {step}")


@pytest.mark.parametrize("name", list(CASES))
def test_loader_workers_that_draw_nothing_move_exactly_and_drawing_ones_are_refused(tmp_path, name):
    module, script, workers, step, refusal, first_epoch_moves = CASES[name]
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} not installed (pip install -e .[test])")
    # (Lightning's also logs, and keeps checkpoints: a checkpoint callback's last.ckpt must be the solo run's)
    logs = (lambda name: ["--logs", str(tmp_path / name)]) if module == "lightning" else (lambda name: [])
    quiet_pace = paced(tmp_path, "0.1", "quiet-unpaced")
    solo = start_py(script, str(tmp_path / "solo.json"), *ARGS, *quiet_pace, *workers, "--no-noise",
                    *logs("solo_logs"), log=str(tmp_path / "solo.log"))
    node = Node(tmp_path, "--virtual-gpus", "2x1GiB")
    try:
        quiet = node.launch(script, str(tmp_path / "quiet.json"), *ARGS, *quiet_pace, *workers, "--no-noise",
                            *logs("logs"), opts=["--gpu", "0"], log_name="quiet.log")
        job = node.job_of(quiet.pid, 60)
        info = _at_step(node, job, step)
        assert info["report"]["movable"], info["report"]      # (running, or resuming from a turn: moved at once)
        node.call("migrate", job=job, gpu=1, new_process=True)      # (answered once its checkpoint is written)
        unpace(tmp_path, "quiet-unpaced")
        assert quiet.wait(300) == 0, (tmp_path / "quiet.log").read_text()[-3000:]
        assert solo.wait(300) == 0, (tmp_path / "solo.log").read_text()[-3000:]
        moved, alone = result(tmp_path / "quiet.json"), result(tmp_path / "solo.json")
        assert moved["first_step"] > step and node.job(job)["migrations"] == 1, (moved, node.job(job))
        assert moved["global_step"] == alone["global_step"] == 64
        assert moved["sha256"] == alone["sha256"], (moved, alone)
        # (before: its second ModelCheckpoint, which had kept its checkpoint and last.ckpt in the first epoch, wrote
        # last.ckpt again at step 64 in the new process)
        if module == "lightning":
            assert moved["logs"] == alone["logs"], (moved["logs"], alone["logs"])

        # (slower batches where the move must land in the first epoch: ~3.6 s after step 3 instead of ~1.2 s,
        # room for a loaded machine; the pause draws nothing and changes no number)
        noisy_pace = paced(tmp_path, "0.3" if first_epoch_moves else "0.1", "noisy-unpaced")
        if first_epoch_moves:
            solo = start_py(script, str(tmp_path / "solo_noisy.json"), *ARGS, *workers, *noisy_pace,
                            log=str(tmp_path / "solo_noisy.log"))
        noisy = node.launch(script, str(tmp_path / "noisy.json"), *ARGS, *workers, *noisy_pace, opts=["--gpu", "0"],
                            log_name="noisy.log")
        job = node.job_of(noisy.pid, 60)
        moves = 0
        if first_epoch_moves:    # in its first epoch (16 steps) the move is exact
            assert _at_step(node, job, 3)["report"]["movable"]
            node.call("migrate", job=job, gpu=1, new_process=True)
            moves = 1
            step = node.wait_for(lambda: node.job(job)["migrations"] == 1 and node.job(job), 120, "the move")["step"]
            assert step < 16, f"moved at step {step}, after the first epoch: the test's timing, not gmux"
        info = _at_step(node, job, 20 if first_epoch_moves else 0)
        assert not info["report"]["movable"] and refusal[:40] in info["report"]["unmovable"], info["report"]
        with pytest.raises(GmuxError, match=refusal):
            node.call("migrate", job=job, gpu=1 - moves, new_process=True)
        unpace(tmp_path, "noisy-unpaced")
        assert noisy.wait(300) == 0, (tmp_path / "noisy.log").read_text()[-3000:]
        ran = result(tmp_path / "noisy.json")
        assert (ran["first_step"] > 0) == bool(moves) and node.job(job)["migrations"] == moves, ran
        if first_epoch_moves:
            assert solo.wait(300) == 0, (tmp_path / "solo_noisy.log").read_text()[-3000:]
            assert ran["sha256"] == result(tmp_path / "solo_noisy.json")["sha256"], ran
    finally:
        node.close()
        if solo.poll() is None:
            solo.kill()
