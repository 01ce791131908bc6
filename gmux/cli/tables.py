"""The jobs table shown by `gmux ps`, `gmux top` and the demo, built from a `ps` reply; and the lines of
`gmux ps --cluster`.

Every cell is a rich Text, never markup: a job's name or exit reason containing `[/bold]` is shown as typed,
and control characters are escaped (gmux.util.text)."""
from __future__ import annotations

from rich.cells import set_cell_size
from rich.table import Table
from rich.text import Text

from gmux.protocol import FINAL_STATES
from gmux.util.sizes import format_size
from gmux.util.text import printable


def _cells(*values) -> list:
    return [Text(printable(v)) for v in values]


DETAIL_CHARS = 100     # WHAT HAPPENED, before it is cut


def _detail(text) -> str:
    """WHAT HAPPENED, cut at a word with an ellipsis where it is long (`gmux ps --json` has all of it)."""
    text = text or ""
    if len(text) <= DETAIL_CHARS:
        return text
    cut = text[:DETAIL_CHARS].rsplit(" ", 1)[0]
    return cut.rstrip(",;:") + "…"


def _rate(v) -> str:
    return f"{v:.1f}" if isinstance(v, (int, float)) else "-"


# What each way of being controlled lets gmuxd do with a job (the job's report says which it is: gmux/job/job.py).
_ALLOWS = {"explicit": "suspend, free mem", "optimizer hook": "suspend, free mem",
           "module hook": "suspend, free mem", "none yet": "no boundary yet",
           "framework": "suspend, free mem"}   # a Trainer's steps (gmux/job/frameworks); move where exact


def _control(j: dict) -> str:
    """CONTROL: how the job's boundaries come, and what that allows; until the job has reported (at a boundary),
    'none yet' for a hooked job that runs (one with no boundary never reports), else '-'."""
    mode = (j.get("report") or {}).get("control")
    if not isinstance(mode, str) and j.get("hook") and j.get("state") == "running":
        mode = "none yet"
    if not isinstance(mode, str):
        return "-"
    allows = _ALLOWS.get(mode, "")
    if mode in ("explicit", "framework") and j.get("migratable") and not j.get("gang"):
        allows += ", move"
    elif j.get("moves_in_process") and not j.get("gang") and allows != _ALLOWS["none yet"]:
        allows += ", move GPU"         # in its own process: not into a new one (gmux migrate --new-process)
    return f"{mode}: {allows}" if allows else mode


def _mem(j: dict) -> str:
    """MEM use/peak/limit: what counts against the job's limit now (where its runtime counts it; else its
    memory at the last boundary), its peak, and its --mem: a hard limit, 'soft' (counted, never refused: a
    declaration for admission), or '-' for none."""
    r = j.get("report") or {}
    use = r.get("mem_in_use") if isinstance(r.get("mem_in_use"), int) else j.get("mem_boundary")
    limit = r.get("mem_limit") if isinstance(r.get("mem_limit"), int) and r.get("mem_limit") else j.get("mem")
    enforced = r.get("mem_enforced")
    mark = " soft" if enforced == "counted" else " (not enforced)" if enforced == "not enforced" else ""
    return f"{format_size(use)}/{format_size(j.get('mem_peak'))}/{format_size(limit)}{mark}"


def _host(j: dict) -> str:
    """HOST: the job's suspended state in host memory, and what of it was spilled to disk."""
    disk = j.get("disk_bytes")
    return format_size(j.get("host_bytes") or 0) + (f" ({format_size(disk)} on disk)" if disk else "")


FREE_TEXT = ("NAME", "CONTROL", "WHAT HAPPENED")     # wrapped, a word too long folded; the rest stay whole
FREE_TEXT_WIDTH = 8     # what free text keeps before the other columns wrap at their spaces (then 4)
WHOLE = ("JOB", "GPU", "STATE")    # the last to be cut, after the numbers: what a user types and looks for


HIDDEN_FIRST = ("HOST", "GPU-s", "RATE now/solo", "SUSPENDS (s)", "MEM use/peak/limit", "STEP", "CONTROL")


class _WholeWords(Table):
    """A table short of width narrows its free text first, then wraps the other columns at their spaces, never
    within a word: rich narrowed every column alike, and folded ids, states and numbers mid-word ('suspende|d',
    '1234|567'). Where even that does not fit, the numbers are folded, then the free text narrowed to a
    column, and only then rich's own way."""

    def fitted_widths(self, console, options, steps: int = 5):
        """The columns' widths by the rule above, its first `steps` steps, or None where they cannot fit so."""
        ranges = [self._measure_column(console, options, c) for c in self.columns]
        widths = [r.maximum for r in ranges]
        free = [i for i, c in enumerate(self.columns) if c.header in FREE_TEXT]
        rest = [i for i in range(len(widths)) if i not in free]
        pad = [self._get_padding_width(i) for i in range(len(widths))]
        numbers = [i for i in rest if self.columns[i].header not in WHOLE]
        for cols, floor in ((free, lambda i: min(widths[i], FREE_TEXT_WIDTH + pad[i])),
                            (rest, lambda i: ranges[i].minimum), (free, lambda i: min(widths[i], 4 + pad[i])),
                            (numbers, lambda i: min(widths[i], 4 + pad[i])), (free, lambda i: 1 + pad[i]))[:steps]:
            floors = {i: floor(i) for i in cols}
            while sum(widths) > options.max_width:
                wide = [i for i in cols if widths[i] > floors[i]]
                if not wide:
                    break
                widths[max(wide, key=lambda i: widths[i])] -= 1
        return widths if sum(widths) <= options.max_width else None

    def _calculate_column_widths(self, console, options) -> list:
        return self.fitted_widths(console, options) or super()._calculate_column_widths(console, options)


class JobsTable:
    """The jobs table at the width it is shown in: where its columns cannot all fit with their words whole and
    the free text FREE_TEXT_WIDTH wide (`gmux ps` on an 80-column terminal folded every cell into a ladder of
    two-letter pieces), the least looked-at columns are left out, in HIDDEN_FIRST's order, and its caption says
    which (`gmux ps --json` has them all)."""

    def __init__(self, ps: dict, title: str = "gmux jobs"):
        self.ps, self.title = ps, title

    def __rich_console__(self, console, options):
        for n in range(len(HIDDEN_FIRST) + 1):
            table = _jobs_table(self.ps, self.title, HIDDEN_FIRST[:n])
            if table.fitted_widths(console, options.update_width(options.max_width - table._extra_width), steps=2):
                break
        yield table


def jobs_table(ps: dict, title: str = "gmux jobs") -> JobsTable:
    return JobsTable(ps, title)


def _jobs_table(ps: dict, title: str, hidden: tuple) -> _WholeWords:
    t = _WholeWords(title=title, title_justify="left",
                    caption=f"too narrow to show {', '.join(hidden)}: gmux ps --json has them" if hidden else None,
                    caption_justify="left")
    columns = [c for c in ("JOB", "NAME", "GPU", "STATE", "CONTROL", "STEP", "RATE now/solo", "MEM use/peak/limit",
                           "GPU-s", "SUSPENDS (s)", "HOST", "WHAT HAPPENED") if c not in hidden]
    for col in columns:
        t.add_column(col, overflow="fold")
    system = bool((ps.get("daemon") or {}).get("system"))   # a system gmuxd's jobs have owners: show them
    if system:
        t.add_column("USER")
    for j in ps["jobs"]:
        gang = j.get("gang")
        name = (j.get("name") or "") + (f" (gang {gang['id']} {gang['rank']}/{gang['size']})" if gang else "")
        gpu = (",".join(map(str, j["exclusive_gpus"])) + " (own)" if j.get("exclusive_gpus") else
               ",".join(map(str, j["parked_gpus"])) + " (lent)" if j.get("parked_gpus") else
               "-" if j.get("gpu") is None else str(j["gpu"]))
        held = j.get("held") and j["state"] != "held" and j["state"] not in FINAL_STATES  # (not "killed (held)")
        cells = {"JOB": j["id"], "NAME": name, "GPU": gpu, "STATE": j["state"] + (" (held)" if held else ""),
                 "CONTROL": _control(j), "STEP": str(j.get("step", 0)),
                 "RATE now/solo": f"{_rate(j.get('rate_now'))}/{_rate(j.get('rate_solo'))}",
                 "MEM use/peak/limit": _mem(j), "GPU-s": f"{j.get('gpu_seconds', 0):.1f}",
                 "SUSPENDS (s)": f"{j.get('suspends', 0)} ({j.get('suspend_seconds', 0):.2f})",
                 "HOST": _host(j), "WHAT HAPPENED": _detail(j.get("detail"))}
        t.add_row(*_cells(*(cells[c] for c in columns), *([j.get("user") or "?"] if system else [])))
    return t


def gpus_table(ps: dict) -> Table:
    t = Table(title="GPUs", title_justify="left")
    for col in ("GPU", "KIND", "MEMORY", "JOBS", "RESIDENT", "PACKS", "SWITCHES", "HELD BY"):
        t.add_column(col)
    for g in ps["gpus"]:
        t.add_row(*_cells(g["index"], "virtual" if g["virtual"] else g["name"], _memory(g),
                          ",".join(g["jobs"]), ",".join(g["resident"]), " ".join("+".join(p) for p in g["packs"]),
                          g["switches"],
                          g.get("owner") or (f"(freeing for {g['reserved']})" if g.get("reserved") else "")))
    return t


def _memory(g: dict) -> str:
    """In use of all: on a real GPU what NVML reads now (every program's; '?' while it cannot be read), on a
    virtual one the working sets of the jobs resident on it, which is all that its budget holds."""
    used = g.get("resident_mem") if g["virtual"] else g.get("mem_used")
    return f"{'?' if used is None else format_size(used)} of {format_size(g['mem_total'])}"


CLUSTER_HEADER = (f"{'JOB':6} {'NAME':16} {'STATE':10} {'MACHINE':10} {'GPU':>3} {'STEP':>8} {'RESTARTS':>8} "
                  f"{'MOVES':>5}  DETAIL")


def cluster_job_line(j: dict) -> str:
    """A job of `gmux ps --cluster`; its name cut and padded by its width on a terminal (a wide character takes
    two columns), so that the columns after it stay in line."""
    return (f"{j['cjob']:6} {set_cell_size(printable(j.get('name') or '-', limit=16), 16)} {j['state']:10} "
            f"{str(j['machine'] or '-'):10} {'-' if j['gpu'] is None else j['gpu']:>3} {j['step']:>8} "
            f"{j['restarts']:>8} {j['migrations']:>5}  {printable(j['detail'], limit=300)}")


def cluster_rank_line(j: dict, r: dict) -> str:
    return (f"  .{r['rank']:<3} {r['state']:10} {str(j['machine'] or '-'):10} "
            f"{'-' if r['gpu'] is None else r['gpu']:>3} {r['step']:>8}  local job {r['local']}")
