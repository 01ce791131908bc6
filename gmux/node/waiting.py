"""Why a job admitted to a GPU waits there for its first turn, said in `ps` where gmuxd has nothing more particular
to say (a job in the queue has admission's own words): which jobs hold that GPU now and whether the job's memory
fits beside them. Shown, not stored: it is read from the `ps` reply being built, so it is as fresh as the reply."""
from __future__ import annotations

from typing import Optional

from gmux.util.sizes import format_size


def waiting_detail(job: dict, gpu: Optional[dict]) -> str:
    """`job` and its GPU's entry (None: it has none yet) as the `ps` reply lists them."""
    if gpu is None:
        return "waiting for a GPU"
    others = [r for r in gpu["resident"] if r != job["id"]]
    if not others:
        return f"waiting for its first turn on GPU {gpu['index']}"
    who = ", ".join(others) + (" run" if len(others) > 1 else " runs")
    need, used = job.get("working_set"), gpu["resident_mem"]
    if need is None:
        return f"waiting for GPU {gpu['index']} to itself (its size is not known: no --mem): {who} there"
    if used + need > gpu["mem_total"]:
        return (f"waiting for memory on GPU {gpu['index']}: it needs {format_size(need)}; {who} there, holding "
                f"{format_size(used)} of {format_size(gpu['mem_total'])}")
    return f"waiting for its turn on GPU {gpu['index']}: {who} there"
