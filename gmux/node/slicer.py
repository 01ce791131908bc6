"""The per-GPU time-slicer: which jobs hold a GPU now, and when to switch. A pure object: no sockets, no clock.

The GPU's runnable jobs are partitioned into *slots*: a kept pack (jobs that run together) or a single job.
One slot is resident at a time. At the end of a quantum the slicer picks the slot with the least weighted
GPU time (stride scheduling: a job of weight 2 is picked twice as often as one of weight 1, and time lost to a
slow switch is paid back rather than forgotten), suspends the jobs leaving and, only once every one of them has
acknowledged (their memory is free), resumes the jobs arriving. So the resident set never exceeds the GPU's
memory, and a job that reaches its boundary late only delays the switch.

A job that does not acknowledge a suspend or a resume by its deadline (gmux.node.pacing: a few of its
mini-batches, at least a floor) is *overdue*: its command stays with it, taken at its next boundary, and the
slicer asks the daemon to stop it (SIGSTOP), provided the jobs arriving fit in memory beside what it keeps
resident. A stopped job holds its memory but computes nothing and is not charged GPU time; at its next turn it
is continued (SIGCONT) and, still overdue, stopped again as soon as its turn is over. A job with no boundary
at all is thus time-sliced by stop and continue alone. When an overdue job reaches its boundary at last, its
command is acknowledged as usual (and, if its turn is not over, it is resumed at once). A job stopped by
someone else (frozen) keeps its memory and gets no turns until it runs again. A job held for a cross-machine
move suspends in place (gmux.job.job): it too keeps its memory (kept) and computes nothing until resumed,
unless another slot needs that memory: then it is asked to suspend for real.

GPU time (`used`): a job holds the GPU from when its resume is sent until its suspend is acknowledged (copy in,
compute, the wait for its boundary, copy out), except while it is stopped or frozen. On a busy time-sliced GPU
the jobs' GPU times add up to the wall time, less the instants between one job's suspend and the next's resume.

The slicer returns commands for the daemon to carry out: ("suspend"/"resume", job) to send, ("stop"/"cont",
job) to signal, ("late", job) once when an overdue job cannot be stopped (it may not be, or the jobs arriving do
not fit beside it) and is waited for. It hears acknowledgements (`acked`); time is passed in (a test's clock)."""
from __future__ import annotations

import math
import statistics
from typing import Optional

from gmux import protocol
from gmux.node.pacing import Pacing
from gmux.node.slicer_entry import Entry


class Slicer:
    def __init__(self, gpu: int, mem_total: int, quantum: float = 60.0, pacing: Optional[Pacing] = None):
        self.gpu = gpu
        self.mem_total = mem_total
        self.quantum = quantum
        self.pacing = pacing or Pacing()
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
        self.stops = 0
        self.backoff_until = -math.inf
        self._later: list[tuple[str, str]] = []   # commands decided between ticks, returned by the next

    # --- membership ---
    def add(self, job: str, weight: float, mem: Optional[int], now: float, resident: bool = False,
            used: float = 0.0, confirm: bool = False, stoppable: bool = True) -> None:
        """A job joins the GPU. With confirm (re-attached or adopted: state only believed), the slicer sends nothing
        here until `observed` hears the job's state, or, if resident, until its deadline after two heartbeats: a job
        waiting for a command says so every protocol.HEARTBEAT_S, so a silent one is computing, maybe never reaching a
        boundary (one not on the GPU may still be registering: no deadline)."""
        live = [e.vtime(now) for e in self.entries.values()]
        e = Entry(job, weight, mem, self._order, used=used, stoppable=stoppable)
        self._order += 1
        # Start level with the least-served job already here: fair from now on, no back pay for the past.
        if live:
            e.credit = max(0.0, min(live) * weight - used)
        self.entries[job] = e
        if confirm:
            self.mark_busy(job, "confirm", now + 2 * protocol.HEARTBEAT_S if resident else None)
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

    def passed(self, job: str, boundaries: Optional[int], now: float) -> None:
        """The job's process has passed `boundaries` mini-batch boundaries. Its mini-batch time is measured
        here as GPU time per boundary, so the time it was stopped never counts: its own clock would count it,
        and a job stopped in a mini-batch would then be given an ever longer deadline and turn."""
        e = self.entries.get(job)
        if e is None or boundaries is None:
            return
        used = self.used(job, now)
        if e.mark is None or boundaries < e.mark[1]:
            e.mark = (used, boundaries)     # the first count heard, or a new process counting from 0
            return
        if boundaries == e.mark[1]:
            return
        if e.mark[1] > 0:   # up to its first boundary the process was starting, not training
            e.batches.append((used - e.mark[0]) / (boundaries - e.mark[1]))
            e.batch_s = statistics.median(e.batches)
        e.mark = (used, boundaries)

    def hold(self, job: str, to_boundary: bool = False, in_place: bool = False, stop_by: Optional[float] = None):
        if job in self.entries:
            e = self.entries[job]
            e.held, e.to_boundary, e.in_place, e.stop_by = True, to_boundary, in_place, stop_by

    def release(self, job: str) -> None:
        if job in self.entries:
            vars(self.entries[job]).update(held=False, to_boundary=False, in_place=False, stop_by=None)

    def suspend_args(self, job: str) -> dict:
        """What the job's suspend command says besides its kind: in place, for a move (see `hold`)."""
        return {"in_place": True} if job in self.entries and self.entries[job].in_place else {}

    def is_kept(self, job: str) -> bool:
        """Whether the job is suspended in place (see `acked`)."""
        return job in self.entries and self.entries[job].kept

    def computing(self, job: str) -> bool:
        """Whether the job holds the GPU's compute now (resident, and neither stopped, frozen nor kept)."""
        return job in self._running()

    # --- commands the daemon sends on its own (migrate, spill) ---
    def mark_busy(self, job: str, kind: str, now: Optional[float] = None) -> None:
        """A command of the daemon's own (not the slicer's) is in flight for `job`, one of this GPU's (else
        ValueError: a job that had left made every later tick fail). The slicer waits for it as for its own
        switches: a migrating (or moving) job's memory is in use until it has left, and a spilling job must not
        be resumed while it writes its state out. With `now`, the command has the job's deadline."""
        if job not in self.entries:
            raise ValueError(f"GPU {self.gpu}: {job} is not on this GPU")
        self.pending[job] = kind
        if now is not None:
            self.entries[job].sent_at = now

    def clear_busy(self, job: str) -> None:
        """That command is over (answered, or given up)."""
        self.pending.pop(job, None)
        if job in self.entries:
            self.entries[job].sent_at = None

    def overdue_busy(self, kind: str, now: float) -> list[str]:
        """Jobs whose command `kind` of the daemon's own, sent with a time, has waited past their deadline."""
        return [j for j, k in self.pending.items() if k == kind and self.entries[j].sent_at is not None
                and now - self.entries[j].sent_at >= self.deadline(j)]

    def busy_to_suspend(self, job: str) -> None:
        """The daemon gives up its command that began with a suspend (a move whose job has not reached its
        boundary): the suspend, still with the job, becomes this slicer's own, with its deadline counted from
        when it was sent. The job is stopped, as any overdue job is, when others need the GPU, and once it
        suspends it resumes here in its turn."""
        if job in self.entries:
            self.pending[job] = "suspend"

    def suspended_here(self, job: str, now: float, busy: Optional[str] = None) -> None:
        """The job, busy with a command of the daemon's own that suspended it (a move in its own process, given
        up once it had suspended), stays on this GPU: it holds no memory here now and resumes in its turn; with
        `busy`, it stays busy with that (a move's rebind by the CUDA driver) until `clear_busy` or it leaves."""
        e = self.entries.get(job)
        if e is None:
            return
        if busy is None:
            self.pending.pop(job, None)
        else:
            self.pending[job] = busy
        e.sent_at = None
        self.resident.discard(job)
        self._stop(e, now)

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
        runnable = {j for j, e in self.entries.items() if not (e.held or e.frozen)}
        slots = [p for p in self.packs if p <= runnable]
        packed = set().union(*slots) if slots else set()
        slots += [frozenset([j]) for j in sorted(runnable - packed, key=lambda j: self.entries[j].order)]
        return slots

    def slot_vtime(self, slot: frozenset, now: float) -> float:
        return min(self.entries[j].vtime(now) for j in slot)

    # --- stopped jobs ---
    def frozen(self, job: str, now: float) -> None:
        """The daemon found the job stopped by someone else: it keeps its memory and gets no turns. A suspend or
        resume out with it is overdue now (taken at its next boundary): its GPU's other jobs are not held up."""
        e = self.entries.get(job)
        if e is not None:
            self._stop(e, now)
            e.stopped, e.frozen, e.overdue = False, True, e.overdue or self.pending.get(job) in ("suspend", "resume")
            self.resident.add(job)

    def thawed(self, job: str, now: float) -> None:
        """A frozen job runs again (continued by whoever stopped it), its GPU time counted again (it ran on free);
        once overdue it is stopped when not in its turn, and its command is taken at its next boundary."""
        e = self.entries.get(job)
        if e is not None and e.frozen:
            e.frozen, e.resident_since = False, now if job in self.resident and not e.kept else None

    def stopped(self) -> list[str]:
        """Jobs that keep their memory on the GPU without computing (stopped by gmuxd or by someone else)."""
        return sorted(j for j, e in self.entries.items() if e.stopped or e.frozen)

    def continued(self, job: str, starting: bool = False) -> bool:
        """Overdue and computing, in its turn or past it not stopped: resident, or `starting` (a start is
        acknowledged at the job's first boundary, and it computes before)."""
        e = self.entries.get(job)
        return (e is not None and e.overdue and not (e.stopped or e.frozen) and (job in self.resident or starting)
                and (self._in_turn(job) or e.late_told))

    def waited(self, job: str, now: float) -> Optional[float]:
        """How long the job's pending suspend or resume has waited for it."""
        e = self.entries.get(job)
        return None if e is None or e.sent_at is None else now - e.sent_at

    def deadline(self, job: str) -> float:
        return min(self.pacing.deadline(self.entries[job].batch_s), self.entries[job].stop_by or math.inf)

    def turn(self, slot) -> float:
        """A slot's turn: the quantum, stretched for a job whose mini-batch is long (gmux.node.pacing)."""
        return max([self.quantum] + [self.pacing.turn(self.quantum, self.entries[j].batch_s) for j in slot])

    # --- acknowledgements ---
    def acked(self, job: str, kind: str, now: float, ok: bool = True, in_place: bool = False) -> None:
        """`job` answered `kind` (in_place: a suspend that kept its memory where it was)."""
        e = self.entries.get(job)
        if e is None or self.pending.get(job) != kind:
            return
        del self.pending[job]
        was_overdue, e.overdue, e.late_told, e.sent_at = e.overdue, False, False, None
        if e.frozen:
            e.frozen = False    # it answered, so it runs: whoever stopped it has continued it
        if kind == "suspend":
            if ok:
                e.kept = in_place       # (kept: still resident, its memory counted until it resumes or leaves)
                if not in_place:
                    self.resident.discard(job)
                self._stop(e, now)
                if e.stopped:
                    # It suspended and was stopped before its answer arrived: continue it, so that it can
                    # wait for its resume (it holds no memory now).
                    e.stopped = False
                    self._later.append(("cont", job))
                if was_overdue and self.switch_to is None and job in self.current:
                    # Continued for its turn, it reached its boundary and took the suspend waiting there:
                    # its turn is not over, so it resumes at once.
                    self.switch_to = self.current
            else:
                # It could not suspend and still holds its memory: abandon this switch, keep it running, and
                # try again only after a quantum (not at every tick).
                self.switch_to = None
                self.current = frozenset(self._running())
                self.since = now
                self.backoff_until = now + self.quantum
        elif kind == "resume":
            if ok:
                self.resident.add(job)
                e.kept = False
                e.last_ran = now
                if e.stopped:
                    self._stop(e, now)   # resumed, then stopped before its answer arrived: still stopped
                elif e.resident_since is None:
                    e.resident_since = now
                if not e.stopped and self.switch_to is not None and job not in self.switch_to:
                    # Answered after its turn was over (no suspend could be sent while its resume was out):
                    # it computes and holds its memory now, so it leaves before the arriving jobs come in.
                    self._send_suspend(job, now)
                    self._later.append(("suspend", job))
                if not self._waiting():
                    self.since = now   # the quantum starts when the whole slot is running
            else:
                self._stop(e, now)

    def observed(self, job: str, state: str, now: float) -> None:
        """What a job says it is doing (after a daemon restart the slicer's belief may be stale)."""
        e = self.entries.get(job)
        if self.pending.get(job) == "confirm":
            self.clear_busy(job)    # a re-attached job has told us its state: the slicer may act again
        if e is None or job in self.pending:
            return
        if state == "running" and job not in self.resident:
            self.resident.add(job)   # it holds memory whatever we believed: count it, and switch properly
            e.resident_since = now
        elif state in ("suspended", "waiting") and job in self.resident and not e.kept:
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
        """Commands to carry out now: [(kind, job)]."""
        out, self._later = self._later, []
        for j in self.overdue_busy("confirm", now):
            self.observed(j, "running", now)   # silent (see `add`): it holds its memory, and is sliced by stops
        out += self._deadlines(now)
        if self._waiting() or now < self.backoff_until:
            return out  # a switch (or a single command) is in flight: wait for every acknowledgement
        # A job leaving that is overdue already (it was continued for its turn) is stopped at once.
        return out + self._decide(now) + self._deadlines(now)

    def _running(self) -> set:
        """Resident jobs that compute (neither stopped, frozen nor kept)."""
        return self.resident - self._kept()

    def _kept(self) -> set:
        """Resident jobs that keep their memory without computing."""
        return {j for j in self.resident if (e := self.entries[j]).stopped or e.frozen or e.kept}

    def _in_turn(self, job: str) -> bool:
        return job in (self.switch_to if self.switch_to is not None else self.current)

    def _waiting(self) -> bool:
        """A command is in flight that the slicer must wait for. An overdue command does not hold it up once
        its job is stopped, frozen, continued for its own turn, or computing on to a move's boundary (stopped
        as soon as others are to run)."""
        for j in self.pending:
            e = self.entries[j]
            if not (e.overdue and (e.stopped or e.frozen or self._in_turn(j) or e.to_boundary)):
                return True
        return False

    def _fits_beside(self, arriving, job: str) -> bool:
        """Whether the jobs arriving fit in memory beside `job` and every other job that keeps its memory."""
        keep = self._kept() | {job}
        together = set(arriving) | keep
        return len(together) == 1 or self.fits(together)

    def _deadlines(self, now: float) -> list[tuple[str, str]]:
        """Overdue suspends and resumes: stop the job when that lets the others run, else say so once."""
        out = []
        for j, kind in list(self.pending.items()):
            e = self.entries[j]
            target = self.switch_to if self.switch_to is not None else self.current
            # A job held for a move computes on to the boundary its move waits for, unless another needs the
            # GPU's compute (stopped, it would reach that boundary only when resumed: the move fails).
            patient = e.to_boundary and kind == "suspend" and not (set(target) - {j})
            if patient and e.stopped and not e.frozen:
                e.stopped = False
                out.append(("cont", j))
                continue
            if kind not in ("suspend", "resume") or e.sent_at is None or e.stopped or e.frozen:
                continue
            if not e.overdue and now - e.sent_at < self.deadline(j):
                continue
            e.overdue = True
            if self._in_turn(j) or patient:
                continue   # continued for its turn (or its overdue resume began one): stopped when it is over
            if e.stopped_while_held() or e.stoppable and self._fits_beside(target, j):
                self._stop(e, now)
                e.stopped = True
                self.resident.add(j)   # an overdue resume may have begun copying in: count its memory
                self.stops += 1
                out.append(("stop", j))
            elif not e.late_told:
                e.late_told = True
                out.append(("late", j))
        return out

    def _decide(self, now: float) -> list[tuple[str, str]]:
        kept = self._kept() - (self.switch_to or frozenset())
        if self.switch_to is not None and kept and not self.fits(self.switch_to | kept):
            # A job leaving kept its memory (suspended in place, for a move): the slot chosen no longer fits
            # beside it, so choose again below among those that do.
            self.switch_to = None
            self.current = frozenset(self._running())
        if self.switch_to is not None:
            # Every job leaving has suspended or been stopped: the arriving ones may start.
            # (a job whose resume is still on its way is not sent another: it answers the one it has)
            # (a kept job arrives too: it resumes, copying nothing, before it computes again)
            arriving = sorted((j for j in self.switch_to - self._running() if self.pending.get(j) != "resume"
                               and (j not in self.resident or self.entries[j].kept)),
                              key=lambda j: self.entries[j].order)
            out = []
            for j in sorted(self.switch_to & self.resident, key=lambda j: self.entries[j].order):
                e = self.entries[j]
                if e.stopped:
                    e.stopped = False
                    e.resident_since = now
                    e.last_ran = now
                    out.append(("cont", j))
            self.current = self.switch_to
            self.switch_to = None
            for j in arriving:
                e = self.entries[j]
                self.pending[j] = "resume"
                e.sent_at, e.overdue, e.late_told = now, False, False
                e.resident_since = now     # it holds the GPU from here: its memory is being copied in
            if arriving:
                return out + [("resume", j) for j in arriving]
            if out:
                self.since = now           # continued jobs: their turn starts now
                return out
        slots = self.slots()
        if not slots:
            out = sorted(self._running())
            for j in out:
                self._send_suspend(j, now)
            self.current = frozenset()
            return [("suspend", j) for j in out if self.entries[j].sent_at == now]
        # An overdue resume in its turn counts as running: its turn goes on, and no second resume is sent.
        running = self._running() | {j for j in self.current if self.pending.get(j) == "resume"}
        settled = self.current in slots and self.current == running
        if settled and self.since is None:
            self.since = now
        expired = (not settled or self.prefer is not None or
                   (len(slots) > 1 and self.since is not None and now - self.since >= self.turn(self.current)))
        if not expired:
            return []
        # A slot runs only if it fits beside the jobs that keep their memory without computing. A job kept in
        # place for a move keeps it only while no one needs it: asked to suspend for real (once it is written).
        kept = self._kept()
        if any((kept - s) and not self.fits(s | kept) for s in slots):
            out = []
            for j in sorted(j for j in kept if self.entries[j].kept and j not in self.pending):
                self.entries[j].in_place = False
                self._send_suspend(j, now)
                out.append(("suspend", j))
            if out:
                return out
        slots = [s for s in slots if not (kept - s) or self.fits(s | kept)]
        if not slots:
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
        leaving = sorted(running - choice)
        self.switch_to = choice
        for j in leaving:
            self._send_suspend(j, now)
        sent = [("suspend", j) for j in leaving if self.entries[j].sent_at == now]
        if self._waiting():
            return sent
        return sent + self._decide(now)   # nothing to wait for: resume (or continue) the arriving jobs now

    def _send_suspend(self, job: str, now: float) -> None:
        """Asks a leaving job to suspend, unless a suspend already waits at its next boundary (overdue)."""
        e = self.entries[job]
        if self.pending.get(job) in ("suspend", "resume") and e.overdue:
            return   # its command is still with it: it is stopped now, by _deadlines
        self.pending[job] = "suspend"
        e.sent_at, e.overdue, e.late_told = now, False, False
