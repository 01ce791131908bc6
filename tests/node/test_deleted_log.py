"""A submitted job's log deleted while it runs (a careless `rm` of the logs): `gmux logs` showed nothing, without a
word. It is read through the job's stdout, which still writes to it, and only that: a job that points its stdout
at another file does not get gmuxd (which may run as root) to show that file."""
import os

DELETES = """import os, sys, time
os.unlink(os.readlink("/proc/self/fd/1"))
print("written after the rm", flush=True)
print("line two", flush=True)
if len(sys.argv) > 2:             # then points its output at another file
    fd = os.open(sys.argv[2], os.O_WRONLY | os.O_APPEND)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
open(sys.argv[1], "w").close()
while os.path.exists(sys.argv[1]):
    time.sleep(0.05)
"""


def _run(node, tmp_path, *args):
    (tmp_path / "job.py").write_text(DELETES)
    flag = tmp_path / "flag"
    job = node.call("submit", argv=["python", str(tmp_path / "job.py"), str(flag), *args], cwd=str(tmp_path), env={},
                    name="rm")["job"]
    node.wait_for(flag.exists, 60, "the job to delete its log and print")
    return job, flag


def test_a_deleted_log_of_a_running_job_is_shown_and_said_to_be_deleted(node_factory, tmp_path):
    node = node_factory("--virtual-gpus", "1x1GiB")
    job, flag = _run(node, tmp_path)
    path = os.path.join(node.rt, "logs", f"{job}.log")
    shown = node.call("logs", job=job)["text"]
    assert f"{path} was deleted while {job} ran" in shown and shown.endswith("written after the rm\nline two\n"), shown
    assert node.call("logs", job=job, tail=1)["text"].endswith(
        f"was deleted while {job} ran; shown from the file it still writes to, which goes when it ends]\nline two\n")
    assert node.call("logs", job=job, raw=True)["bytes"] == b"written after the rm\nline two\n"
    flag.unlink()
    node.wait_for(lambda: node.job(job)["state"] == "exited", 60, "the job's end")
    assert node.call("logs", job=job)["text"] == f"[gmuxd: {path} was deleted]\n"


def test_a_job_pointing_its_output_elsewhere_does_not_get_that_file_shown(node_factory, tmp_path):
    node = node_factory("--virtual-gpus", "1x1GiB")
    secret = tmp_path / "secret"
    secret.write_text("not the log\n")
    job, flag = _run(node, tmp_path, str(secret))
    shown = node.call("logs", job=job)["text"]
    assert "not the log" not in shown and "was deleted]" in shown, shown
    flag.unlink()


def test_logs_raw_says_the_log_was_deleted_apart_from_its_bytes(node_factory, tmp_path):
    """gmux logs --raw of a deleted log printed nothing and exited 0, where gmux logs said it was deleted: the
    note went into the text form only. It is said on standard error, the bytes on standard output stay the log's."""
    import subprocess

    from node_harness import PY, ROOT, env
    node = node_factory("--virtual-gpus", "1x1GiB")
    job, flag = _run(node, tmp_path)
    path = os.path.join(node.rt, "logs", f"{job}.log")
    for ended in (False, True):
        out = subprocess.run([PY, "-m", "gmux.cli.gmux", "--runtime-dir", node.rt, "logs", "--raw", job], env=env(),
                             cwd=ROOT, capture_output=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert out.stdout == (b"" if ended else b"written after the rm\nline two\n"), out.stdout
        assert f"gmux: gmuxd: {path} was deleted".encode() in out.stderr, out.stderr
        flag.unlink(missing_ok=True)
        node.wait_for(lambda: node.job(job)["state"] == "exited", 60, "the job's end")
