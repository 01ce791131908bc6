"""End to end: a Hugging Face Trainer loading its data in worker processes moves to a new process and ends
bit-identical to its solo run when nothing its workers run draws random numbers; when its collator draws (noise
added in the workers), the move is refused with the reason and the job finishes where it is.
"""
import importlib.util
import os

import pytest

from gmux.wire.daemon_client import GmuxError
from node_harness import ROOT, Node, result, start_py

HF = os.path.join(ROOT, "tests", "scripts", "hf_trainer.py")
ARGS = ["--epochs", "4", "--samples", "256", "--workers", "2", "--sleep", "0.1"]
pytestmark = pytest.mark.skipif(importlib.util.find_spec("transformers") is None,
                                reason="transformers not installed (pip install -e .[test])")


def _movable(node: Node, job: str) -> dict:
    def framework():
        info = node.job(job)
        return info if (info.get("report") or {}).get("control") == "framework" and info["step"] > 0 else None
    return node.wait_for(framework, 120, "the Trainer under gmux") or node.job(job)


def test_loader_workers_that_draw_nothing_move_exactly_and_drawing_ones_are_refused(tmp_path):
    solo = start_py(HF, str(tmp_path / "solo.json"), *ARGS, "--no-noise", log=str(tmp_path / "solo.log"))
    node = Node(tmp_path, "--virtual-gpus", "2x1GiB")
    try:
        quiet = node.launch(HF, str(tmp_path / "quiet.json"), *ARGS, "--no-noise", opts=["--gpu", "0"],
                            log_name="quiet.log")
        job = node.job_of(quiet.pid, 60)
        info = _movable(node, job)
        assert info["report"]["movable"] and info["state"] == "running", info["report"]
        node.call("migrate", job=job, gpu=1, new_process=True)
        assert quiet.wait(300) == 0, (tmp_path / "quiet.log").read_text()[-3000:]
        assert solo.wait(300) == 0, (tmp_path / "solo.log").read_text()[-3000:]
        moved, alone = result(tmp_path / "quiet.json"), result(tmp_path / "solo.json")
        assert moved["first_step"] > 0 and node.job(job)["migrations"] == 1, (moved, node.job(job))
        assert moved["global_step"] == alone["global_step"] == 64
        assert moved["sha256"] == alone["sha256"], (moved, alone)

        noisy = node.launch(HF, str(tmp_path / "noisy.json"), *ARGS, opts=["--gpu", "0"], log_name="noisy.log")
        job = node.job_of(noisy.pid, 60)
        info = _movable(node, job)
        why = info["report"]["unmovable"] or ""    # (a report carries its first 64 characters)
        assert why.startswith("its data loader's worker processes draw random"), info["report"]
        with pytest.raises(GmuxError, match="worker processes draw random numbers as its collator collates"):
            node.call("migrate", job=job, gpu=1, new_process=True)
        assert noisy.wait(300) == 0, (tmp_path / "noisy.log").read_text()[-3000:]
        assert result(tmp_path / "noisy.json")["first_step"] == 0 and node.job(job)["migrations"] == 0
    finally:
        node.close()
        if solo.poll() is None:
            solo.kill()
