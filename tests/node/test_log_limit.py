"""A job that floods its output cannot fill the disk: its log is held under gmuxd --log-limit, newest half kept."""
import os

from gmux.node.log_limit import trim


def test_a_log_over_its_limit_keeps_its_newest_whole_lines_and_says_how_much_went(tmp_path):
    path = str(tmp_path / "j1.log")
    lines = [f"step {k} loss {k / 7:.6f}\n".encode() for k in range(20000)]
    with open(path, "wb") as f:
        f.write(b"".join(lines))
    size = os.path.getsize(path)
    assert trim(path, size) is None and os.path.getsize(path) == size      # at the limit: untouched
    dropped = trim(path, 100_000)
    text = open(path, "rb").read()
    head, _, rest = text.partition(b"\n")
    assert head == f"[gmuxd: {dropped:,} bytes of this job's output dropped: its log is kept under 100,000 bytes " \
                   f"(gmuxd --log-limit)]".encode()
    assert rest.endswith(lines[-1]) and rest.split(b"\n")[0] + b"\n" in lines      # whole lines, the newest
    assert len(rest) <= 50_000 and dropped + len(rest) == size
    assert trim(str(tmp_path / "gone.log"), 10) is None


def test_a_flooding_job_is_held_under_the_limit_and_runs_on(node_factory, tmp_path):
    """A print in a tight loop wrote 3.9 GB in 25 s."""
    node = node_factory("--virtual-gpus", "1x1GiB", "--log-limit", "1MiB")
    flood = tmp_path / "flood.py"
    flood.write_text("for k in range(400000):\n    print('x' * 60, k)\nprint('DONE')\n")
    job = node.call("submit", argv=["python", str(flood)], cwd=str(tmp_path), env={}, name="flood")["job"]
    log = os.path.join(node.rt, "logs", f"{job}.log")
    biggest = []
    node.wait_for(lambda: biggest.append(os.path.getsize(log) if os.path.exists(log) else 0) or
                  node.job(job)["state"] in ("exited", "failed"), 180, "the flooding job to end", every=0.05)
    assert node.job(job)["state"] == "exited", node.job(job)
    text = open(log, "rb").read()
    assert text.rstrip().endswith(b"DONE") and b"bytes of this job's output dropped" in text
    # (26 MB written in all; between two looks, every 2 s, a job this fast adds a few MB at most)
    assert max(biggest) < 24 << 20 and len(text) < 1 << 20
