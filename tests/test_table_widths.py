"""`gmux ps` short of width: ids, states and numbers stay whole (wrapped at their spaces at most), the free text
(NAME, CONTROL, WHAT HAPPENED) gives up its width first. Every column folded alike ('suspende|d', '1234|567')."""
import io
import subprocess

from rich.console import Console

from gmux.cli.tables import jobs_table
from gmux_testkit import PY, ROOT, env

HELD = {"id": "j12", "name": "resnet50-sweep-lr3", "state": "suspended", "held": True, "gpu": 0, "step": 45678,
        "rate_now": 123.4, "rate_solo": 456.7, "mem_boundary": 3 << 30, "mem_peak": 5 << 30, "mem": 8 << 30,
        "gpu_seconds": 845.6, "suspends": 34, "suspend_seconds": 3.45, "host_bytes": 3 << 30, "disk_bytes": 1 << 30,
        "report": {"control": "optimizer hook"}, "hook": True, "exclusive_gpus": [], "parked_gpus": [],
        "detail": "suspended by gmux suspend; its share of GPU 0 is free"}
RUNNING = {"id": "j13", "name": "bert", "state": "running", "gpu": 1, "step": 99, "rate_now": 3.2,
           "mem_boundary": 1 << 30, "mem_peak": 2 << 30, "gpu_seconds": 1.0, "suspends": 0, "suspend_seconds": 0.0,
           "host_bytes": 0, "report": {"control": "explicit"}, "migratable": True, "detail": "",
           "exclusive_gpus": [], "parked_gpus": []}


def _table(width: int) -> str:
    buf = io.StringIO()
    Console(file=buf, width=width, color_system=None).print(jobs_table({"jobs": [HELD, RUNNING]}))
    return buf.getvalue()


def _words(text: str) -> set:
    return {w for line in text.splitlines() for cell in line.split("│") for w in cell.split()}


def test_at_120_columns_ids_states_and_numbers_stay_whole():
    text = _table(120)
    assert max(map(len, text.splitlines())) <= 120, text
    assert {"j12", "j13", "suspended", "(held)", "running", "45678", "123.4/456.7", "3.0GiB/5.0GiB/8.0GiB",
            "(3.45)", "1.0GiB/2.0GiB/-", "3.2/-"} <= _words(text), text
    assert "too narrow to show HOST, GPU-s: gmux ps --json has them" in " ".join(text.split()), text
    assert "845.6" not in text and "on disk" not in text


def test_at_80_columns_the_least_looked_at_columns_are_left_out_and_the_rest_stay_whole():
    """At 80 columns every cell was folded into two-letter pieces ('jo|b-|1', 'no|ne|ye|t:'), names and numbers
    alike: the columns could not all fit. The least looked-at are left out, and the caption says which."""
    text = _table(80)
    assert max(map(len, text.splitlines())) <= 80, text
    assert {"j12", "j13", "suspended", "(held)", "running", "45678", "99", "bert", "hook:", "suspend;"} <= _words(
        text), text
    said = " ".join(text.split())
    assert ("too narrow to show HOST, GPU-s, RATE now/solo, SUSPENDS (s), MEM use/peak/limit: gmux ps --json has "
            "them" in said), text
    for width in (40, 60):
        narrow = _table(width)
        assert max(map(len, narrow.splitlines())) <= width and {"j12", "j13", "running"} <= _words(narrow), narrow


def test_wide_enough_every_column_is_shown_and_nothing_said():
    text = _table(220)
    assert "too narrow" not in text and {"845.6", "3.0GiB", "(1.0GiB", "34", "(3.45)"} <= _words(text), text


def test_piped_ps_is_laid_out_for_columns_where_it_is_set(tmp_path):
    """Piped, it was 160 columns whatever COLUMNS said (and `gmux ps | less` on a narrow terminal wrapped it)."""
    script = ("import sys; from gmux.cli import gmux; from gmux.wire import daemon_client\n"
              "class C:\n"
              "    def __init__(self, *a, **k): pass\n"
              f"    def call(self, *a, **k): return {{'jobs': [{HELD!r}], 'gpus': [], 'daemon': {{}}}}\n"
              "gmux.Client = C\n"
              "sys.exit(gmux.main(['--runtime-dir', sys.argv[1], 'ps']))\n")
    for columns, widest in (("80", 80), ("120", 120), (None, 160)):
        e = env() | ({"COLUMNS": columns} if columns else {})
        out = subprocess.run([PY, "-c", script, str(tmp_path)], env=e, cwd=ROOT, capture_output=True, text=True,
                             timeout=60)
        assert out.returncode == 0, out.stderr
        assert max(map(len, out.stdout.splitlines())) == widest, (columns, out.stdout)


def test_a_columns_of_zero_or_next_to_nothing_still_shows_the_table(tmp_path):
    """COLUMNS=0 (a careless export) printed nothing at all, status 0: rich took it for a width of 0; COLUMNS=5
    printed five columns of box lines, no cell readable. Piped, COLUMNS=0 is as if unset (160 columns), and one
    too narrow is the narrowest width that keeps ids and states whole; gmux ps and gmux top alike."""
    script = ("import sys; from gmux.cli import gmux; from gmux.wire import daemon_client\n"
              "class C:\n"
              "    def __init__(self, *a, **k): pass\n"
              f"    def call(self, *a, **k): return {{'jobs': [{HELD!r}, {RUNNING!r}], 'gpus': [], 'daemon': {{}}}}\n"
              "gmux.Client = C\n"
              "sys.exit(gmux.main(['--runtime-dir', sys.argv[1], *sys.argv[2:]]))\n")
    for command in (["ps"], ["top", "--count", "1"]):
        for columns, widest in (("0", 160), ("5", 40), ("39", 40)):
            out = subprocess.run([PY, "-c", script, str(tmp_path), *command], env=env() | {"COLUMNS": columns},
                                 cwd=ROOT, capture_output=True, text=True, timeout=60)
            assert out.returncode == 0, out.stderr
            assert max(map(len, out.stdout.splitlines()), default=0) == widest, (command, columns, out.stdout)
            assert {"j12", "j13", "running"} <= _words(out.stdout), (command, columns, out.stdout)
