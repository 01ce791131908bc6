"""When a cluster job's next periodic checkpoint is due on this machine (gmux.node.cluster_link takes and sends it).

Every `ckpt_every` seconds, a job that runs or is suspended and is past its first step sends one checkpoint set
to the scheduler, which restarts the job from its newest if its machine is lost. A job whose reports say a new
process would not continue it exactly (gmux.job.movability: an optimizer attach() was not given, a loader's
workers that drew their seeds in an earlier epoch) is refused one by gmuxd, naming why. That refusal reaches the
scheduler's log once for each reason, not once every period; the periods go on as before once the reports say
the job is movable again.
"""
from __future__ import annotations

from typing import Optional

TAKEN_IN = ("running", "suspended")


class CheckpointClock:
    def __init__(self):
        self.every: dict[str, float] = {}
        self.last: dict[str, float] = {}
        self.refused: dict[str, str] = {}    # cjob -> the reason its reports gave when a checkpoint was last asked
        self.seq = 0

    def started(self, cjob: str, every: Optional[float], now: float) -> None:
        """A start of the job here; its first checkpoint comes a period later."""
        if every:
            self.every[cjob], self.last[cjob] = float(every), now

    def due(self, cjob: str, rec: dict, ranks: list, now: float) -> Optional[int]:
        """The sequence number of a checkpoint to take now, or None. `rec`: the job's record for the scheduler;
        `ranks`: each rank's record from gmuxd (their reports)."""
        why = next((r["report"]["unmovable"] for r in ranks
                    if isinstance(r.get("report"), dict) and isinstance(r["report"].get("unmovable"), str)), None)
        if why is None:
            self.refused.pop(cjob, None)
        every = self.every.get(cjob)
        if (not every or rec["state"] not in TAKEN_IN or rec["step"] == 0 or now - self.last.get(cjob, 0.0) < every
                or (why is not None and self.refused.get(cjob) == why)):
            return None
        if why is not None:
            self.refused[cjob] = why
        self.last[cjob] = now
        self.seq += 1
        return self.seq
