"""The per-GPU time-slicer: which jobs hold a GPU now, and when to switch. A pure object: no sockets, no clock.

The GPU's runnable jobs are partitioned into *slots*: a kept pack (jobs that run together) or a single job.
One slot is resident at a time. At the end of a quantum the slicer picks the slot with the least weighted
GPU time (stride scheduling: a job of weight 2 is picked twice as often as one of weight 1, and time lost to a
slow switch is paid back rather than forgotten), suspends the jobs leaving and, only once every one of them has
acknowledged (their memory is free), resumes the jobs arriving. So the resident set never exceeds the GPU's
memory, and a job that reaches its boundary late only delays the switch.

The slicer returns commands ("suspend"/"resume", job) for the daemon to send and is told of acknowledgements
through `acked`. Time is passed in, so tests drive it with a fake clock.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional


@dataclass
class Entry:
    id: str
    weight: float
    mem: Optional[int]          # working set in bytes; None: not known yet
    order: int                  # arrival order: ties go to the job that came first
    used: float = 0.0           # GPU seconds resident (real time, shown to users)
    credit: float = 0.0         # head start given on arrival so a newcomer does not monopolise the GPU
    last_ran: float = -math.inf
    held: bool = False          # suspended by the user: not scheduled
    resident_since: Optional[float] = None

    def vtime(self, now: float) -> float:
        used = self.used + (now - self.resident_since if self.resident_since is not None else 0.0)
        return (used + self.credit) / self.weight


class Slicer:
    def __init__(self, gpu: int, mem_total: int, quantum: float = 60.0):
        self.gpu = gpu
        self.mem_total = mem_total
        self.quantum = quantum
        self.entries: dict[str, Entry] = {}
        self.packs: list[frozenset] = []      # groups that run together (kept packs and a pack on trial)
        self.current: frozenset = frozenset() # the slot chosen to be resident
        self.resident: set[str] = set()       # jobs that hold GPU memory (acknowledged resumes, or running)
        self.pending: dict[str, str] = {}     # job -> command awaiting acknowledgement
        self.switch_to: Optional[frozenset] = None
        self.since: Optional[float] = None    # when the current slot became fully resident
        self.prefer: Optional[frozenset] = None  # run this slot next (a pack on trial), regardless of quantum
        self._order = 0
        self.switches = 0
        self.backoff_until = -math.inf

    # --- membership ---
    def add(self, job: str, weight: float, mem: Optional[int], now: float, resident: bool = False,
            used: float = 0.0, confirm: bool = False) -> None:
        """A job joins the GPU. With confirm (re-attached after a daemon restart, state only believed), the
        slicer sends nothing on this GPU until `observed` hears the job's actual state."""
        live = [e.vtime(now) for e in self.entries.values()]
        e = Entry(job, weight, mem, self._order, used=used)
        self._order += 1
        # Start level with the least-served job already here: fair from now on, no back pay for the past.
        if live:
            e.credit = max(0.0, min(live) * weight - used)
        self.entries[job] = e
        if confirm:
            self.pending[job] = "confirm"
        if resident:
            self.resident.add(job)
            e.resident_since = now
            e.last_ran = now
            self.current = self.current | {job}
            self.since = self.since if self.since is not None else now

    def remove(self, job: str, now: float) -> None:
        e = self.entries.pop(job, None)
        if e is None:
            return
        self._stop(e, now)
        self.resident.discard(job)
        self.pending.pop(job, None)
        self.packs = [p for p in self.packs if job not in p]
        self.current = self.current - {job}
        if self.switch_to is not None:
            self.switch_to = self.switch_to - {job}
        if self.prefer is not None and job in self.prefer:
            self.prefer = None

    def set_mem(self, job: str, mem: Optional[int]) -> list[frozenset]:
        """A new working-set figure. Returns packs that no longer fit (dissolved)."""
        if job in self.entries:
            self.entries[job].mem = mem
        broken = [p for p in self.packs if job in p and not self.fits(p)]
        for p in broken:
            self.unpack(p)
        return broken

    def hold(self, job: str) -> None:
        if job in self.entries:
            self.entries[job].held = True

    def release(self, job: str) -> None:
        if job in self.entries:
            self.entries[job].held = False

    # --- commands the daemon sends on its own (migrate, spill) ---
    def mark_busy(self, job: str, kind: str) -> None:
        """A command of the daemon's own (not the slicer's) is in flight for `job`. The slicer waits for it as for
        one of its own switches: a migrating job's memory is in use until it has left, and a spilling job must
        not be resumed while it writes its state out."""
        self.pending[job] = kind

    def clear_busy(self, job: str) -> None:
        """That command is over (answered, or given up)."""
        self.pending.pop(job, None)

    def busy_with(self, job: str) -> Optional[str]:
        """The command awaiting `job`'s acknowledgement (suspend, resume, migrate, spill, confirm), if any."""
        return self.pending.get(job)

    # --- packs ---
    def fits(self, jobs) -> bool:
        mems = [self.entries[j].mem for j in jobs]
        if len(mems) == 1:
            return True  # admission already checked a single job against the GPU's size
        return all(m is not None for m in mems) and sum(mems) <= self.mem_total

    def pack(self, jobs: frozenset, run_now: bool = True) -> None:
        if not self.fits(jobs):
            raise ValueError(f"jobs {sorted(jobs)} do not fit together in {self.mem_total} bytes")
        self.packs = [p for p in self.packs if not (p & jobs)] + [jobs]
        if run_now:
            self.prefer = jobs

    def unpack(self, jobs: frozenset) -> None:
        self.packs = [p for p in self.packs if p != jobs]
        if self.prefer == jobs:
            self.prefer = None

    def slots(self) -> list[frozenset]:
        runnable = {j for j, e in self.entries.items() if not e.held}
        slots = [p for p in self.packs if p <= runnable]
        packed = set().union(*slots) if slots else set()
        slots += [frozenset([j]) for j in sorted(runnable - packed, key=lambda j: self.entries[j].order)]
        return slots

    def slot_vtime(self, slot: frozenset, now: float) -> float:
        return min(self.entries[j].vtime(now) for j in slot)

    # --- acknowledgements ---
    def acked(self, job: str, kind: str, now: float, ok: bool = True) -> None:
        e = self.entries.get(job)
        if e is None or self.pending.get(job) != kind:
            return
        del self.pending[job]
        if kind == "suspend":
            if ok:
                self.resident.discard(job)
                self._stop(e, now)
            else:
                # It could not suspend and still holds its memory: abandon this switch, keep it running, and
                # try again only after a quantum (not at every tick).
                self.switch_to = None
                self.current = frozenset(self.resident)
                self.since = now
                self.backoff_until = now + self.quantum
        elif kind == "resume":
            if ok:
                self.resident.add(job)
                e.resident_since = now
                e.last_ran = now
                if not self.pending:
                    self.since = now   # the quantum starts when the whole slot is running

    def observed(self, job: str, state: str, now: float) -> None:
        """What a job says it is doing (after a daemon restart the slicer's belief may be stale)."""
        e = self.entries.get(job)
        if self.pending.get(job) == "confirm":
            del self.pending[job]   # a re-attached job has told us its state: the slicer may act again
        if e is None or job in self.pending:
            return
        if state == "running" and job not in self.resident:
            self.resident.add(job)   # it holds memory whatever we believed: count it, and switch properly
            e.resident_since = now
        elif state in ("suspended", "waiting") and job in self.resident:
            self.resident.discard(job)
            self._stop(e, now)

    def _stop(self, e: Entry, now: float) -> None:
        if e.resident_since is not None:
            e.used += now - e.resident_since
            e.resident_since = None
            e.last_ran = now

    def used(self, job: str, now: float) -> float:
        e = self.entries[job]
        return e.used + (now - e.resident_since if e.resident_since is not None else 0.0)

    # --- the decision ---
    def tick(self, now: float) -> list[tuple[str, str]]:
        """Commands to send now: [(kind, job)]."""
        if self.pending or now < self.backoff_until:
            return []  # a switch (or a single command) is in flight: wait for every acknowledgement
        if self.switch_to is not None:
            # Every job leaving has suspended: its memory is free, so the arriving ones may start.
            arriving = sorted(self.switch_to - self.resident, key=lambda j: self.entries[j].order)
            self.current = self.switch_to
            self.switch_to = None
            if arriving:
                for j in arriving:
                    self.pending[j] = "resume"
                return [("resume", j) for j in arriving]
        slots = self.slots()
        if not slots:
            out = sorted(self.resident)
            for j in out:
                self.pending[j] = "suspend"
            self.current = frozenset()
            return [("suspend", j) for j in out]
        settled = self.current in slots and self.current == self.resident
        if settled and self.since is None:
            self.since = now
        expired = (not settled or self.prefer is not None or
                   (len(slots) > 1 and self.since is not None and now - self.since >= self.quantum))
        if not expired:
            return []
        if self.prefer is not None and self.prefer in slots:
            choice = self.prefer
        else:
            def key(s):
                last = now if s == self.current else max(self.entries[j].last_ran for j in s)
                return (round(self.slot_vtime(s, now), 9), last, min(self.entries[j].order for j in s))
            choice = min(slots, key=key)
        self.prefer = None
        if choice == self.current and settled:
            self.since = now       # the same slot again: a fresh quantum, no switch
            return []
        self.switches += 1
        self.since = None
        leaving = sorted(self.resident - choice)
        self.switch_to = choice
        if leaving:
            for j in leaving:
                self.pending[j] = "suspend"
            return [("suspend", j) for j in leaving]
        return self.tick(now)      # nothing to free: resume the arriving jobs at once
