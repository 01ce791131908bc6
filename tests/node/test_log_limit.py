"""A job that floods its output cannot fill the disk: its log is held under gmuxd --log-limit, newest half kept."""
import json
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
    # A second trim counts the first's loss too: each line counted only its own, 2,000x less than was lost
    with open(path, "ab") as f:
        f.write(b"".join(lines))
    again = trim(path, 100_000)
    head2 = open(path, "rb").read().partition(b"\n")[0]
    assert head2.startswith(f"[gmuxd: {dropped + again - len(head) - 1:,} bytes".encode()), head2
    # A log its job holds locked (trimming it) is left for the next look, unless it has outgrown any trim
    import fcntl
    with open(path, "ab") as job:
        fcntl.flock(job.fileno(), fcntl.LOCK_EX)
        job.write(b"x\n" * 100_000)
        job.flush()
        assert trim(path, 100_000) is None                          # 250,000 bytes: the job's to finish
        job.write(b"x\n" * 100_000)
        job.flush()
        assert trim(path, 100_000) > 0 and os.path.getsize(path) <= 50_200    # 450,000: trimmed all the same


# Writes 4 MiB at a time, three times, each time waiting (at most a minute) for its log, its stdout, to be trimmed
# under 2 MiB: the log is held down while the job runs, whatever the machine's speed.
FLOOD = """import os, sys, time
log = os.readlink("/proc/self/fd/1")
for r in range(3):
    sys.stdout.write(("x" * 63 + "\\n") * 65536)
    sys.stdout.flush()
    deadline = time.time() + 60
    while os.path.getsize(log) > 2 << 20 and time.time() < deadline:
        time.sleep(0.05)
    print("round", r, "log bytes", os.path.getsize(log), flush=True)
print("DONE")
"""


def test_a_flooding_job_is_held_under_the_limit_and_runs_on(node_factory, tmp_path):
    """A print in a tight loop wrote 3.9 GB in 25 s."""
    node = node_factory("--virtual-gpus", "1x1GiB", "--log-limit", "1MiB")
    flood = tmp_path / "flood.py"
    flood.write_text(FLOOD)
    job = node.call("submit", argv=["python", str(flood)], cwd=str(tmp_path), env={}, name="flood")["job"]
    node.wait_for(lambda: node.job(job)["state"] in ("exited", "failed"), 240, "the flooding job to end")
    assert node.job(job)["state"] == "exited", node.job(job)
    text = open(os.path.join(node.rt, "logs", f"{job}.log"), "rb").read()
    assert text.rstrip().endswith(b"DONE") and b"bytes of this job's output dropped" in text and len(text) < 1 << 20
    seen = int(text.split(b"round 2 log bytes ")[1].split()[0])
    assert seen < 2 << 20      # trimmed while it ran: untrimmed, it would have held 12 MiB


UNLINKED = """import json, os, re, sys
os.unlink(os.readlink("/proc/self/fd/1"))     # as a careless `rm` of the logs would
for _ in range(4096):
    print("y" * 1023)
sys.stdout.write("z" * (3 << 20) + "\\n")     # one write larger than the bound: its newest part is kept
print("LAST LINE", flush=True)
text = open("/proc/self/fd/1", "rb").read()
head, _, rest = text.partition(b"\\n")
lost = sum(int(n.replace(b",", b"")) for n in re.findall(rb"\\[gmux: ([0-9,]+) bytes of this job's output", text))
json.dump({"size": os.fstat(1).st_size, "last": text.endswith(b"zz\\nLAST LINE\\n"),
           "said": b"bytes of this job's output dropped: its log is kept under 2,097,152 bytes" in head,
           "counted": lost, "output": len(re.sub(rb"\\n?\\[gmux: [^\\n]*\\]\\n", b"", text))},
          open(sys.argv[1], "w"))
"""


def test_a_log_nobody_can_trim_is_still_held_by_the_job(node_factory, tmp_path):
    """gmuxd trims a log every few seconds and not at all once it is deleted: a deleted log grew to 4.7 GB in 6 s,
    unseen. The job holds its own output under twice the limit, keeping its newest lines."""
    node = node_factory("--virtual-gpus", "1x1GiB", "--log-limit", "1MiB")
    script = tmp_path / "unlinked.py"
    script.write_text(UNLINKED)
    job = node.call("submit", argv=["python", str(script), str(tmp_path / "seen")], cwd=str(tmp_path), env={},
                    name="rm")["job"]
    node.wait_for(lambda: node.job(job)["state"] in ("exited", "failed"), 120, "the job to end")
    assert node.job(job)["state"] == "exited", node.job(job)     # 7 MiB printed, at most 2 MiB kept: it ran on
    seen = json.loads((tmp_path / "seen").read_text())
    assert seen["size"] <= 2 << 20 and seen["last"] and seen["said"], seen
    written = 4096 * 1024 + (3 << 20) + 1 + len("LAST LINE\n")
    assert seen["counted"] + seen["output"] == written, seen     # every byte kept or counted as lost


def test_a_log_past_twice_its_limit_is_trimmed_at_the_next_tick(daemon, monkeypatch):
    """`os.write(1, ...)` in a loop goes around the job's own bound (it holds sys.stdout's writes): it wrote 4 GB
    at --log-limit 1MiB between two of gmuxd's trims, seconds apart."""
    from gmux.node import log_limit
    from node_harness import register
    monkeypatch.setattr(log_limit, "EVERY_S", 3600.0)     # the next round of trims is far away
    job = daemon.jobs[register(daemon)["job"]]
    job.managed = True
    daemon.opt.log_limit = daemon.log_bounds.limit = 1 << 20
    path = daemon.rundir.log_file(job.id)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "ab") as f:
        f.write(b"x" * 1023 + b"\n")
    daemon.tick()
    with open(path, "ab") as f:
        f.write((b"y" * 1023 + b"\n") * 1536)          # 1.5 MiB: past the limit, left for the round of trims
    daemon.tick()
    assert os.path.getsize(path) == 1537 << 10
    with open(path, "ab") as f:
        f.write((b"z" * 1023 + b"\n") * 1024)          # 2.5 MiB: past twice the limit, as no bounded job gets
    daemon.tick()
    text = open(path, "rb").read()
    assert len(text) < 600 << 10 and b"bytes of this job's output dropped" in text and text.endswith(b"z\n")


def test_what_the_ticks_trim_is_said_once_with_the_next_round(tmp_path):
    """A flood trimmed at every tick gave gmuxd's own log a line per tick (15 a second)."""
    from gmux.node.log_limit import Bounds
    bounds, path = Bounds(1 << 20), str(tmp_path / "j1.log")
    dropped = 0
    for _ in range(3):
        with open(path, "ab") as f:
            f.write((b"w" * 1023 + b"\n") * 2560)
        size = os.path.getsize(path)
        assert bounds.hold("j1", path, due=False) == 0
        dropped += size - os.path.getsize(path) + len(open(path, "rb").readline())
    assert bounds.hold("j1", path, due=True) == dropped and bounds.hold("j1", path, due=True) == 0


WRITER = """import os, sys
from gmux.job.log_output import _Log
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_APPEND)
log = _Log(int(sys.argv[2]))
for k in range(int(sys.argv[3])):
    log.write(fd, b"%09d\\n" % k)
"""


def test_output_written_while_gmuxd_trims_is_kept_or_counted_never_lost(tmp_path):
    """gmuxd's trim reads the tail, empties the file and writes the tail back: a line the job wrote between the
    tail's read and the emptying was lost, a hole in the log that its count of dropped bytes did not include. A
    job's writes (through its streams) now wait for a trim under way, and gmuxd's trim for a write."""
    import re
    import subprocess
    import sys
    from node_harness import ROOT
    path, limit, lines = str(tmp_path / "j1.log"), 20_000, 300_000
    open(path, "wb").close()
    writer = subprocess.Popen([sys.executable, "-c", WRITER, path, str(limit), str(lines)], cwd=ROOT,
                              env={**os.environ, "PYTHONPATH": ROOT})
    trims = 0
    while writer.poll() is None:
        trims += bool(trim(path, limit))
    assert writer.wait() == 0 and trims > 10, trims
    head, _, rest = open(path, "rb").read().partition(b"\n")
    dropped = int(re.match(rb"\[gmuxd?: ([\d,]+) bytes", head).group(1).replace(b",", b""))
    kept = [int(k) for k in rest.split()]
    first = kept[0]
    assert kept == list(range(first, lines)), [k for a, k in zip(kept, kept[1:]) if k != a + 1][:5]
    assert dropped == 10 * first
