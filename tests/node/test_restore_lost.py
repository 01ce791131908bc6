"""gmux-launch --restore PATH (a move's or a spill's new process) whose checkpoint cannot be read: the job ends,
saying so in its exit record, and its script is not run. It ran before as a brand-new job, from scratch and
without a word where it reached no boundary (a plain script's run of 5 steps, its checkpoint deleted)."""
import os
import subprocess

from gmux.rundir import RuntimeDir, read_exit

from node_harness import PY, ROOT, env

SCRIPT = "open(__file__ + '.ran', 'w').close()\n"


def _launch(rt: str, script, *opts, environ=None):
    return subprocess.run([PY, "-m", "gmux.cli.launch", "--runtime-dir", rt, *opts, "--", "python", str(script)],
                          env=environ or env(), cwd=ROOT, capture_output=True, text=True, timeout=60)


def test_a_restore_whose_checkpoint_is_not_there_ends_before_its_script_runs(tmp_path):
    rt = RuntimeDir(str(tmp_path / "rt"))
    rt.create()
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    gone = tmp_path / "j9.ckpt"
    by_hand = _launch(rt.root, script, "--restore", str(gone))
    assert by_hand.returncode == 2, by_hand.stderr
    assert by_hand.stderr == f"gmux-launch: cannot restore the job from {gone}: No such file or directory; its " \
                             f"script is not run, which would start from scratch\n"
    # A new process gmuxd knows the job of says why in its record (gmuxd reads it: no gmuxd needed before then).
    moved = _launch(rt.root, script, "--job", "j9", "--restore", str(tmp_path),
                    environ={**env(), "GMUX_JOB_TOKEN": "t" * 32})
    said = f"cannot restore job j9 from {tmp_path}: not a regular file; its script is not run, which would start " \
           f"from scratch"
    assert moved.returncode == 2 and moved.stderr == f"gmux-launch: {said}\n", moved.stderr
    assert read_exit(rt, "j9") == {"status": 2, "reason": said}
    assert not os.path.exists(f"{script}.ran")
    # Through torchrun, --restore was left out without a word: its ranks started from scratch.
    torchrun = subprocess.run([PY, "-m", "gmux.cli.launch", "--runtime-dir", rt.root, "--restore", str(tmp_path),
                               "--", "torchrun", "--nproc-per-node", "1", str(script)],
                              env=env(), cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert torchrun.returncode == 2 and "--restore and --job are for a job's new process that gmuxd starts, never " \
                                       "through torchrun" in torchrun.stderr, torchrun.stderr
    assert not os.path.exists(f"{script}.ran")


def test_a_checkpoint_deleted_while_its_job_waited_for_its_turn_fails_the_job(node_factory, tmp_path):
    """Read again when gmuxd starts the job: a spilled job's new process may wait long for its turn."""
    node = node_factory("--virtual-gpus", "1x1GiB")
    spin = node.launch(os.path.join(ROOT, "tests", "node", "spin_job.py"), opts=("--mem", "1GiB"))
    node.job_of(spin.pid)
    ckpt, script = tmp_path / "j2.ckpt", tmp_path / "train.py"
    ckpt.write_bytes(b"")
    script.write_text(SCRIPT)
    waiting = node.launch(str(script), opts=("--mem", "1GiB", "--restore", str(ckpt)), log_name="waiting.log")
    job = node.job_of(waiting.pid)
    node.wait_for(lambda: node.job(job)["state"] == "waiting", 30, "the second job waits for its turn")
    ckpt.unlink()
    spin.kill()
    assert waiting.wait(60) == 2
    said = f"cannot restore job {job} from {ckpt}: No such file or directory; its script is not run, which would " \
           f"start from scratch"
    assert (tmp_path / "waiting.log").read_text().endswith(f"gmux-launch: {said}\n")
    node.wait_for(lambda: node.job(job)["state"] == "failed", 30, "the job recorded failed")
    assert node.job(job)["detail"] == said and node.job(job)["exit_status"] == 2
    assert read_exit(RuntimeDir(node.rt), job) == {"status": 2, "reason": said}
    assert not os.path.exists(f"{script}.ran")
