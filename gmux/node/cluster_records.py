"""What a machine's cluster link tells the scheduler about its jobs: one record per cluster job, built from
gmuxd's table, and what its ranks' answers add up to (pure functions, no I/O).

A cluster job runs as gmuxd jobs named CJOB (one GPU) or CJOB.RANK (a rank of a gang); the scheduler sees one
record per CJOB, with its ranks.
"""
from __future__ import annotations

import re
from typing import Optional

from gmux import protocol
from gmux.wire.daemon_client import GmuxBusy, GmuxError

LOCAL_NAME = re.compile(r"^(c\d+)(?:\.(\d+))?$")    # CJOB (a one-GPU job) or CJOB.RANK (a rank of a gang)


def ranks_by_job(jobs: list, spawned: dict) -> dict:
    """cjob -> {rank: gmuxd record}. One record per rank: the process the link started last for it (an older
    incarnation, e.g. the released copy of a job that has since come back, must not speak for it; `spawned`
    is cjob -> the pids of its ranks); after a restart of the link, the live local job of that name (an ended
    one must not hide a copy that runs on), else the newest."""
    latest: dict[tuple, dict] = {}
    for j in jobs:
        m = LOCAL_NAME.match(j.get("name") or "")
        if not m:
            continue
        key = (m.group(1), int(m.group(2) or 0))
        pids = spawned.get(key[0])
        if pids is not None:
            if key[1] < len(pids) and j.get("pid") == pids[key[1]]:
                latest[key] = j
        elif key not in latest or _rank(j) > _rank(latest[key]):
            latest[key] = j
    by_job: dict[str, dict] = {}
    for (cjob, rank), j in latest.items():
        by_job.setdefault(cjob, {})[rank] = j
    return by_job


def gang_record(cjob: str, world: int, by_rank: dict, restoring: bool = False) -> dict:
    """The one record the scheduler sees for a job of `world` ranks (rank -> its gmuxd record): it runs while
    any rank runs; it has ended well when every rank has; it has failed when one rank has (then `_broken` says
    whether other ranks live on and must be stopped). Its step is the slowest rank's. `boundless`: every rank
    computes without having reached a boundary, in a start from nothing (one `restoring` has not restored yet)."""
    present = [by_rank[r] for r in sorted(by_rank)]
    r0 = by_rank.get(0, present[0])
    # (the rank that failed on its own before one killed as its peer: the other ranks' ends follow from its)
    bad = sorted(((r, j) for r, j in by_rank.items() if j["state"] in protocol.FINAL_STATES
                  and not (j["state"] == "exited" and j.get("exit_status") == 0)),
                 key=lambda rj: (rj[1]["state"] == "killed", rj[0]))
    live = [j for j in present if j["state"] not in protocol.FINAL_STATES]
    parked = (r0.get("parked_gpus") or [None])[0] if live and all(j.get("parked_gpus") for j in live) else None
    head = bad[0][1] if bad else r0
    if bad:
        state = head["state"]
    elif len(present) < world:
        state = "waiting"          # a rank has not registered yet
    elif not live:
        state = "exited"
    else:
        state = "running" if any(j["state"] == "running" for j in live) else live[0]["state"]
    rec = {"cjob": cjob, "local": r0["id"], "state": state,
           "step": min(int(j.get("step") or 0) for j in present) if len(present) == world else 0,
           "gpu": r0.get("gpu"), "rate_now": _number(r0.get("rate_now")), "rate_solo": _number(r0.get("rate_solo")),
           "mem_peak": max((j["mem_peak"] for j in present if isinstance(j.get("mem_peak"), int)), default=None),
           "gpu_seconds": sum(float(j.get("gpu_seconds") or 0.0) for j in present),
           "exit_status": head.get("exit_status") if state in protocol.FINAL_STATES else None,
           "detail": (f"rank {bad[0][0]}: " if bad and world > 1 else "") + str(head.get("detail") or "")[:500],
           "held": any(bool(j.get("held", False)) for j in present), "_broken": bool(bad and live),
           "parked_gpu": parked,
           # (stopped or suspending too: a job gmuxd holds that never reached a boundary never suspends)
           "boundless": bool(live) and len(present) == world and not restoring and not bad
           and all(j["state"] in ("running", "stopped", "suspending") and not j.get("started")
                   and not (j.get("report") or {}).get("awaiting_restore") for j in live)}
    unmovable = [(r, j["report"]["unmovable"]) for r, j in sorted(by_rank.items()) if j in live
                 and isinstance(j.get("report"), dict) and isinstance(j["report"].get("unmovable"), str)
                 and j["report"]["unmovable"]]
    if unmovable:       # (a new process would not continue it exactly: the scheduler moves it nowhere)
        rank, why = unmovable[0]
        rec["unmovable"] = (f"rank {rank}: " if world > 1 else "") + why[:500]
    if world > 1:
        rec["ranks"] = [{"rank": r, "local": j["id"], "gpu": j.get("gpu"), "state": j["state"],
                         "step": int(j.get("step") or 0)} for r, j in sorted(by_rank.items())]
    return rec


def _rank(j: dict) -> tuple:
    return j["state"] not in protocol.FINAL_STATES, local_number(j["id"])


def local_number(job_id: str) -> int:
    digits = "".join(c for c in job_id if c.isdigit())
    return int(digits) if digits else 0


def _number(v) -> Optional[float]:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def running_before_boundary(suspend_s: float, replies: list) -> Optional[float]:
    """Of a move's suspend (`suspend_s` from the request), how long the job still computed: until the first
    rank's boundary, that is the whole minus the part after it (gmuxd's reply: job_latency_s, of which
    boundary_wait_s before the boundary). Where downtime begins; None if a reply does not say."""
    after = []
    for reply in replies:
        job, wait = (reply or {}).get("job_latency_s"), (reply or {}).get("boundary_wait_s")
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (job, wait)):
            return None
        after.append(job - wait)
    return max(0.0, suspend_s - max(after)) if after else None


def taken_at(steps: dict, ranks: list) -> int:
    """The step a set of rank checkpoints holds (every rank's is taken at one boundary; the lowest if not)."""
    known = [steps.get(r) for r in ranks]
    if any(s is None for s in known):
        raise GmuxError(f"checkpoint: gmuxd did not say which step the checkpoint of "
                        f"{', '.join(r for r, s in zip(ranks, known) if s is None)} holds")
    return min(known)


def busy_data(error: GmuxError) -> dict:
    """An action_failed event's data for gmuxd's refusal: whether it was only for now (a move or suspend under
    way), which the scheduler must not take for a refusal of the action itself."""
    return {"busy": True} if isinstance(error, GmuxBusy) else {}


def kill_reason(mtype: str, event: Optional[str]) -> dict:
    """What this machine's `gmux ps` says of a cluster job's copy its link kills (not "killed by gmux kill")."""
    if mtype != "kill":
        return {}
    return {"reason": "released: the cluster scheduler runs the job elsewhere now" if event == "released" else
            "killed through the cluster (gmux kill --cluster, a copy the scheduler no longer runs, or a gang "
            "whose other rank ended)"}
