"""Strings a job chose (its name, exit reason, log) never drive the terminal of whoever looks at them, and are
never read as rich markup."""
import io

from rich.console import Console

from gmux.cli.tables import gpus_table, jobs_table
from gmux.util.text import printable

HOSTILE = "\x1b]0;owned\x07\x1b[2J[/bogus][bold]x\u202eevil\r\x9b31m"


def test_printable_escapes_every_control_and_format_character():
    out = printable(HOSTILE)
    assert out.isprintable() and "\x1b" not in out and "\u202e" not in out and "\x9b" not in out
    assert "\\x1b]0;owned\\x07" in out and "\\u202e" in out and "[/bogus]" in out
    assert printable("line 1\n\tline 2", keep="\n\t") == "line 1\n\tline 2"
    assert printable("ok", limit=1) == "o…"


def test_ps_table_shows_hostile_text_as_typed_and_never_crashes():
    job = {"id": "j1", "name": HOSTILE, "state": "failed", "detail": HOSTILE, "gpu": 0, "step": 1,
           "exclusive_gpus": [], "parked_gpus": []}
    gpu = {"index": 0, "virtual": True, "name": "v", "mem_total": 1 << 30, "jobs": ["j1"], "resident": [],
           "packs": [], "switches": 0}
    buf = io.StringIO()
    con = Console(file=buf, width=300, force_terminal=True, color_system=None)
    con.print(jobs_table({"jobs": [job]}))     # `[/bogus]` raised rich.errors.MarkupError before
    con.print(gpus_table({"gpus": [gpu]}))
    text = buf.getvalue()
    assert "\x1b]0;" not in text and "\x07" not in text and "\u202e" not in text
    assert "[/bogus]" in text and "\\x1b]0;owned" in text
    # Memory in use of all: NVML's reading on a real GPU ('?' while unreadable), the resident jobs' on a virtual.
    real = dict(gpu, virtual=False, name="H100", mem_total=80 << 30, mem_used=5 << 30)
    for g, shown in ((dict(gpu, resident_mem=256 << 20), "256.0MiB of 1.0GiB"), (real, "5.0GiB of 80.0GiB"),
                     (dict(real, mem_used=None), "? of 80.0GiB")):
        buf = io.StringIO()
        Console(file=buf, width=300, color_system=None).print(gpus_table({"gpus": [g]}))
        assert shown in buf.getvalue()


def test_log_tail_is_cut_by_bytes_on_a_character_boundary(tmp_path):
    """A job that printed 400k non-ASCII characters made `gmux logs --tail 5` fail: logs were cut by characters,
    and a reply of characters of 3 bytes each outgrew a message."""
    from gmux import protocol
    from gmux.util.text import file_end, tail, tail_bytes
    log = tmp_path / "j1.log"
    log.write_text("€" * 400_000 + "\nsecond to last\nlast\n")
    text = tail(str(log), protocol.MAX_FRAME // 2)
    assert len(text.encode()) <= protocol.MAX_FRAME // 2 and "\ufffd" not in text and text.endswith("last\n")
    assert tail(str(log), protocol.MAX_FRAME // 2, lines=2) == "second to last\nlast\n"
    assert tail(str(tmp_path / "missing.log"), 100) == ""
    big = tmp_path / "big.log"
    with open(big, "wb") as f:          # a log of 64 MiB: only its end is read
        f.truncate(64 << 20)
        f.seek(0, 2)
        f.write("é\n".encode() * 10)
    # Cut at a line's start (`gmux logs` of a log over a reply's size began mid-line), raw or as text
    assert tail(str(big), 7) == tail(str(big), 8) == "é\né\n"
    assert tail_bytes(str(big), 8) == "é\né\n".encode()
    assert file_end(str(big), 8) == ("é\né\n".encode(), (64 << 20) + 24)   # the cut line counted as left out
    long_line = tmp_path / "one_line.log"
    long_line.write_text("é" * 1000)
    assert tail(str(long_line), 7) == "ééé"    # no line end: cut inside an é, its second byte is dropped
    assert tail_bytes(str(long_line), 7) == "é".encode()[1:] + "ééé".encode()   # raw: every byte, as written


def test_daemon_logs_escape_what_a_job_chose_and_keep_tracebacks(tmp_path):
    """gmuxd, gmux-scheduler and the cluster link log through log_to_stderr: a job's text quoted in a log line
    (a failed command's error, an exit reason) can neither drive the terminal nor forge a log line."""
    import subprocess
    import sys
    code = ("import logging, sys\n"
            "from gmux.util.text import log_to_stderr\n"
            "log_to_stderr('gmuxd')\n"
            "logging.getLogger('gmux.node').warning('j1: suspend failed: %s', sys.argv[1])\n"
            "try:\n    raise ValueError('boom')\nexcept ValueError:\n"
            "    logging.getLogger('gmux.node').exception('tick')\n")
    forged = HOSTILE + "\n2026-01-01 00:00:00,000 gmuxd INFO j2 admitted"
    err = subprocess.run([sys.executable, "-c", code, forged], capture_output=True, text=True, check=True).stderr
    first, *rest = err.splitlines()
    assert "\x1b" not in err and "\x07" not in err and "\u202e" not in err and "\x9b" not in err
    assert first.endswith("gmuxd WARNING j1: suspend failed: " + printable(forged))
    assert "\\x0a2026-01-01" in first and not any("j2 admitted" in line for line in rest)
    assert rest[1] == "Traceback (most recent call last):" and rest[-1] == "ValueError: boom"


def test_cluster_ps_lines_stay_in_columns_whatever_the_names_width():
    from rich.cells import cell_len

    from gmux.cli.tables import CLUSTER_HEADER, cluster_job_line
    base = {"cjob": "c1", "state": "running", "machine": "m1", "gpu": 0, "step": 12, "restarts": 0,
            "migrations": 1, "detail": "ok"}
    lines = [cluster_job_line({**base, "name": n}) for n in ("ab", "训练任务名字很长的名字", "résumé", "x\x1b[31m", None)]
    where = [cell_len(line[:line.index("running")]) for line in lines]
    assert where == [cell_len(CLUSTER_HEADER[:CLUSTER_HEADER.index("STATE")])] * len(lines), lines
    assert "\x1b" not in "".join(lines)
