"""A submitted job's output into its log on a full disk: the job trains on and the log says what was lost.

Before: the job's next print raised "No space left on device", the job died ("failed: exit status 1") and its
traceback, written to the same full disk, was lost with the reason."""
import contextlib
import errno
import os
import subprocess
import sys

import pytest

from node_harness import Node

CHILD = r"""
import os, sys
from gmux.job.log_output import keep_going_on_full_disk
keep_going_on_full_disk("/dev")            # fd 1 and 2 are /dev/full: "a log in /dev", both streams' one
print("x" * 100_000)
sys.stdout.flush()
sys.stderr.write("e" * 1000 + "\n")
sys.stderr.flush()
os.dup2(os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_APPEND), 1)    # room again
print("after", flush=True)
"""


def test_output_the_disk_has_no_room_for_is_counted_and_said_once_there_is(tmp_path):
    out = tmp_path / "out"
    with open("/dev/full", "wb") as full:
        p = subprocess.run([sys.executable, "-c", CHILD, str(out)], stdout=full, stderr=full, timeout=60)
    assert p.returncode == 0
    assert out.read_text() == ("\n[gmux: 101,002 bytes of this job's output were lost here: the log's disk was "
                               "full]\nafter\n")


def test_a_write_the_filling_disk_takes_only_part_of_counts_the_rest_as_lost(tmp_path, monkeypatch):
    """A disk that fills up mid-write takes part of it and says ENOSPC only at the next: the rest was counted
    as written, lost with no word."""
    from gmux.job import log_output
    real, room = os.write, [1000]
    fd = os.open(tmp_path / "log", os.O_WRONLY | os.O_CREAT | os.O_APPEND)

    def filling(f, data):
        if f != fd:
            return real(f, data)
        if room[0] <= 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        n = real(f, bytes(data[:room[0]]))
        room[0] -= n
        return n
    monkeypatch.setattr(log_output.os, "write", filling)
    log = log_output._Log(0)
    log.write(fd, b"a" * 3000)
    room[0] = 1 << 30
    log.write(fd, b"after\n")
    os.close(fd)
    assert (tmp_path / "log").read_bytes() == b"a" * 1000 + (
        b"\n[gmux: 2,000 bytes of this job's output were lost here: the log's disk was full]\nafter\n")


def test_a_job_started_from_a_shell_keeps_its_own_streams(tmp_path):
    """Where a job's output goes outside gmuxd's logs is its user's: a print to a full disk fails as it would."""
    with open("/dev/full", "wb") as full:
        p = subprocess.run([sys.executable, "-c", "from gmux.job.log_output import keep_going_on_full_disk; "
                            f"keep_going_on_full_disk({str(tmp_path)!r}); print('x' * 100_000)"],
                           stdout=full, stderr=subprocess.PIPE, timeout=60)
    assert p.returncode != 0 and b"No space left on device" in p.stderr


TRAINER = """import sys, time, torch
torch.manual_seed(0)
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(64, 8), torch.randn(64, 1)
for step in range(int(sys.argv[2])):
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
    print(f"step {step} " + "." * 2000, flush=True)
    if step == 5:
        open(sys.argv[1] + ".filling", "w").close()     # the test fills the disk now
    time.sleep(0.02)
torch.save(model.state_dict(), sys.argv[1])
print("done", flush=True)
"""


def test_a_submitted_job_trains_through_a_full_log_disk(tmp_path):
    rt = tmp_path / "rt"
    rt.mkdir(mode=0o700)
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m,mode=0700", "tmpfs", str(rt)],
                      capture_output=True).returncode != 0:
        pytest.skip("needs a small filesystem of its own: mounting a tmpfs is not permitted here (not root)")
    node = None
    try:
        node = Node(tmp_path, "--virtual-gpus", "1x1GiB")
        (tmp_path / "train.py").write_text(TRAINER)
        weights = tmp_path / "w.pt"
        job = node.call("submit", argv=["python", str(tmp_path / "train.py"), str(weights), "400"],
                        cwd=str(tmp_path), env={}, name="full")["job"]
        node.wait_for(lambda: (tmp_path / "w.pt.filling").exists(), 120, "the job to print its first steps")
        filler = rt / "filler"
        try:
            with open(filler, "wb") as f:      # every byte left, as another writer would take it
                while True:
                    f.write(b"\0" * 65536)
                    f.flush()
        except OSError as e:                   # full; in CI once already at the open (ENOSPC): full all the same
            assert e.errno == errno.ENOSPC, e
        node.wait_for(lambda: node.job(job)["step"] > 100 if node.job(job).get("step") else False, 120,
                      "the job to train on with its log's disk full")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(filler)
        node.wait_for(lambda: node.job(job)["state"] in ("exited", "failed", "killed", "lost"), 120,
                      lambda: "the job's end, with what its disk holds:\n" + _listing(rt))
        assert node.job(job)["state"] == "exited", (node.job(job), _listing(rt))
        log = (rt / "logs" / f"{job}.log").read_text()
        assert "bytes of this job's output were lost here: the log's disk was full]" in log and "done" in log, \
            log[-3000:] + _listing(rt)
        assert weights.exists()
    finally:
        if node is not None:
            node.close()
        subprocess.run(["umount", "-l", str(rt)], capture_output=True)


def _listing(directory) -> str:
    return subprocess.run(["du", "-a", str(directory)], capture_output=True, text=True).stdout


def test_output_unbuffered_by_python_u_stays_unbuffered(tmp_path):
    """`gmux submit -- python -u train.py` wrote nothing to its log until 8 KiB had gathered (lost with the job
    when it was killed): the rebuilt stream was buffered whatever the job asked."""
    code = ("import os, sys\nfrom gmux.job.log_output import keep_going_on_full_disk\n"
            f"keep_going_on_full_disk({str(tmp_path)!r})\n"
            "print('first line')\nprint(open(sys.argv[1]).read() == 'first line\\n', file=sys.stderr)\n")
    out = tmp_path / "j1.log"
    for flags, env_u, expected in (([], {"PYTHONUNBUFFERED": ""}, "False"), (["-u"], {}, "True"),
                                   ([], {"PYTHONUNBUFFERED": "1"}, "True")):
        environ = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
        environ.update({k: v for k, v in env_u.items() if v})
        with open(out, "wb") as f:
            p = subprocess.run([sys.executable, *flags, "-c", code, str(out)], stdout=f, stderr=subprocess.PIPE,
                               env=environ, timeout=60, text=True)
        assert p.returncode == 0 and p.stderr.strip() == expected, (flags, env_u, p.stderr)
