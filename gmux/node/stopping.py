"""Carrying out the slicer's stops: a job that misses its suspend's (or resume's) deadline loses the GPU's compute.

The slicer decides (gmux.node.slicer: "stop", "cont", "late"); this part signals the job's processes through
the Supervisor (pid and start time checked), tells a job stopped by someone else apart (frozen: never
continued by gmuxd), answers the user's `gmux suspend` at the deadline, logs a decision with the numbers once
per missed deadline, and writes what `gmux ps` shows in the job's detail. A gang rank, or any job holding GPUs
of its own, is never stopped to let others run: its GPUs free nothing for them; the slicer is told so when the
job is seated (`stoppable`). Held, it is (every rank of a gang: gmux.node.slicer_entry, stopped_while_held).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from gmux.node.jobs import Job
from gmux.node.slicer import Slicer
from gmux.util.sizes import format_size

if TYPE_CHECKING:
    from gmux.node.daemon import Daemon


# A job continued from outside again and again is stopped each time, and said so at most this often (seconds).
RESTOP_TOLD_S = 60.0


class Stopping:
    def __init__(self, node: "Daemon"):
        self.node = node
        self._restopped: dict[str, float] = {}     # job -> when its being continued from outside was last told

    def carry_out(self, slicer: Slicer, kind: str, job: Job, now: float) -> None:
        if kind == "stop":
            self._stop(slicer, job, now)
        elif kind == "cont":
            if job.stopped_by_gmux:
                self.node.sup.cont(job)
                job.stopped_by_gmux = False
                self.node.store.save(job)   # a restarted gmuxd must not think it still stopped
        elif kind == "late":
            self._late(slicer, job, now)

    def _stop(self, slicer: Slicer, job: Job, now: float) -> None:
        node = self.node
        if node.sup.stopped_outside(job):
            slicer.frozen(job.id, now)    # someone else stopped it: theirs to continue, not ours
            outside = True
        else:
            outside = False
            # Recorded before the signal: a gmuxd killed between the two would leave the job stopped with a table
            # saying nobody stopped it, and its successor would take it for frozen from outside and never run it.
            job.stopped_by_gmux = True
            node.store.save(job)
            if not node.sup.stop(job):
                job.stopped_by_gmux = False   # its process is gone: the reaper ends it
                node.store.save(job)
                return
            job.stops += 1
        numbers = self._numbers(slicer, job, now)
        text = self._stop_text(slicer, job, now, outside)
        sent = slicer.entries[job.id].sent_at
        if job._late_told != sent:    # the same missed deadline at a later turn is counted, not logged again
            job._late_told = sent
            node.decide(slicer.gpu, "stop", [job.id], {**numbers, "outside": outside}, text)
        # but whoever asked since (a second `gmux suspend` after a resume) hears it too
        self._settle(slicer, job, True, text, numbers)

    def _late(self, slicer: Slicer, job: Job, now: float) -> None:
        numbers = self._numbers(slicer, job, now)
        text = self._late_text(slicer, job, now, numbers)
        self.node.decide(slicer.gpu, "late", [job.id], numbers, text)
        self._settle(slicer, job, False, text, numbers)

    def answer_late(self, slicer: Slicer, job: Job, now: float) -> None:
        """A request made after the job missed its deadline hears at once what was done then: stopped (by gmuxd
        between its turns, or by someone else), or found late and computing on. The slicer says either once per
        missed deadline, and the request would wait for a boundary that may never come. (A hold for a move waits
        for the boundary itself: its job is continued to reach it.)"""
        e = slicer.entries.get(job.id)
        if e is None or not e.overdue:
            return
        numbers = self._numbers(slicer, job, now)
        if (e.stopped or e.frozen) and not e.to_boundary:
            self._settle(slicer, job, True, self._stop_text(slicer, job, now, e.frozen), numbers)
        elif e.late_told and not (e.stopped or e.frozen or e.stopped_while_held()):   # (that one is stopped next)
            self._settle(slicer, job, False, self._late_text(slicer, job, now, numbers), numbers)

    def _stop_text(self, slicer: Slicer, job: Job, now: float, outside: bool) -> str:
        # (held by `gmux suspend`, it has no turns: it said "continued at each of its turns" and stayed stopped)
        held = job.held and not slicer.entries[job.id].to_boundary
        return (f"GPU {slicer.gpu}: {job.id} " + self._why(slicer, job, now) +
                (": it was found stopped by someone else (SIGSTOP, a debugger), and gets no turns until it is "
                 "continued (SIGCONT)" if outside else
                 ": stopped (SIGSTOP) while held, until `gmux resume` gives it its turns again (SIGCONT)" if held else
                 ": stopped (SIGSTOP), and continued (SIGCONT) at each of its turns until it reaches a boundary") +
                _keeps_beside(slicer, job))

    def _late_text(self, slicer: Slicer, job: Job, now: float, numbers: dict) -> str:
        if job.exclusive:
            why = ("it holds GPUs of its own, so stopping it would free nothing for others" +
                   (", and its gang's other ranks would wait for it in their next collective" if job.gang else ""))
        else:
            target = slicer.switch_to if slicer.switch_to is not None else slicer.current
            arriving = sorted(j for j in target if j != job.id)
            unknown = [j for j in [job.id, *arriving] if slicer.entries[j].mem is None]
            need = sum(slicer.entries[j].mem or 0 for j in arriving)
            why = (f"the memory of {', '.join(unknown)} is not known yet, and a job of unknown size shares its GPU "
                   f"with no other (a job declares it with --mem; one with no boundary never reports it)"
                   if unknown else
                   f"{', '.join(arriving) or 'the next jobs'} ({format_size(need)}) would not fit beside the "
                   f"{format_size(numbers['mem'])} it keeps (GPU of {format_size(slicer.mem_total)})")
        return (f"GPU {slicer.gpu}: {job.id} {self._why(slicer, job, now)}: not stopped, because {why}; "
                f"its {slicer.busy_with(job.id)} waits for its next boundary")

    def _settle(self, slicer: Slicer, job: Job, stopped: bool, text: str, numbers: dict) -> None:
        """Who waits on the missed command hears what was done; so does a user's suspend of a held job, which
        waits behind a command the job has not acknowledged yet (its first resume, in a job still starting up)."""
        kinds = {slicer.busy_with(job.id) or "suspend"} | ({"suspend"} if job.held else set())
        for kind in kinds:
            self.node.commands.settle(job.id, kind, stopped, text, numbers)

    def _why(self, slicer: Slicer, job: Job, now: float) -> str:
        e = slicer.entries[job.id]
        waited = slicer.waited(job.id, now) or 0.0
        basis = (f"{slicer.pacing.k:g} x its {e.batch_s:.2f} s mini-batch" if e.batch_s
                 else "its mini-batch time is not known yet")
        return (f"did not reach a boundary in {waited:.1f} s (deadline {slicer.deadline(job.id):.1f} s: at least "
                f"{slicer.pacing.floor:g} s, {basis}); " + self._control(job))

    @staticmethod
    def _control(job: Job) -> str:
        control = job.last_report.get("control")
        if job.boundaries == 0:
            return ("it has reached no mini-batch boundary since it started, so its memory cannot be freed (how "
                    f"gmux controls it: {control or 'no boundary seen'})")
        return f"it passed {job.boundaries} boundaries before" + (f" (control: {control})" if control else "")

    @staticmethod
    def _numbers(slicer: Slicer, job: Job, now: float) -> dict:
        e = slicer.entries[job.id]
        return {"waited_s": round(slicer.waited(job.id, now) or 0.0, 3),
                "deadline_s": round(slicer.deadline(job.id), 3), "batch_s": e.batch_s,
                "mem": e.mem or 0, "boundaries": job.boundaries}

    # --- what gmux ps shows ---
    def note(self, slicer: Slicer, job: Job, now: float) -> None:
        """The job's detail while it is overdue, stopped or frozen; cleared (if still ours) once it is not."""
        e = slicer.entries[job.id]
        note = ""
        waited = slicer.waited(job.id, now)
        kept = _kept(slicer, job)
        never = job.boundaries == 0
        if e.frozen:
            note = f"stopped from outside gmux, keeps {kept}; runs again on SIGCONT"
        elif e.stopped:
            # (no command waiting: a resume it answered while being stopped; it stays stopped until its turn)
            note = (f"stopped: no boundary yet, keeps {kept}, which can't be freed" if never else
                    f"stopped, keeps {kept}" if waited is None else
                    f"stopped (no boundary in {waited:.1f} s), keeps {kept}")
        elif e.overdue and waited is not None and e.late_told:
            note = (f"no boundary yet: not stopped (gmux decisions says why), computes on, keeps {kept}" if never
                    else f"no boundary in {waited:.1f} s: not stopped (gmux decisions says why), computes on")
        elif e.overdue and waited is not None and not e.stoppable:
            # (GPUs of its own, a gang's or several: never stopped for others; it was said to be, between turns)
            note = (f"no boundary yet: computes on, never stopped (its GPUs are its own), keeps {kept}" if never
                    else f"no boundary in {waited:.1f} s: computes on, never stopped (its GPUs are its own)")
        elif e.overdue and waited is not None and len(slicer.entries) == 1:
            # (alone on its GPU it has no turns to be stopped between: it was said to be)
            note = (f"no boundary yet: computes on alone, keeps {kept}; stopped (SIGSTOP) between turns once another "
                    f"job shares GPU {slicer.gpu}" if never else
                    f"no boundary in {waited:.1f} s: computes on alone; sliced by SIGSTOP/SIGCONT once another job "
                    f"shares GPU {slicer.gpu}")
        elif e.overdue and waited is not None:
            note = (f"no boundary yet: computes in its turns, stopped (SIGSTOP) between them, keeps {kept}"
                    if never else f"no boundary in {waited:.1f} s: sliced by SIGSTOP/SIGCONT")
        elif job.id not in slicer.resident and not job.held:
            # (its owner may be another user, who cannot read that job's decisions: this is all they are told)
            on = sorted(j for j, o in slicer.entries.items() if j != job.id and o.overdue and o.late_told
                        and not (o.stopped or o.frozen))
            if on:
                note = (f"waits for its turn: {', '.join(on)} reached no boundary in its own turn and computes on, "
                        f"not stopped (its memory is not known, or would not leave room)")
        if note:
            control = job.last_report.get("control")
            job.detail = job._note = note + (f" (control: {control})" if control and never else "")
        elif job._note:
            if job.detail == job._note:
                job.detail = ""
            job._note = ""

    # --- the daemon's lifecycle ---
    def check_frozen(self, slicer: Slicer, now: float) -> None:
        """A job stopped by someone else that runs again is given back to the slicer; one stopped by a signal in
        its turn (SIGSTOP, Ctrl-Z) gives its turn up at once: the others on its GPU waited for the turn's end and
        its suspend's deadline, and `gmux ps` showed it running all that time. (One held by a debugger is found
        at that deadline, as before: a sampling profiler holds a job for moments, and would cost it its turns.)
        A job gmuxd stopped out of its turn that someone else continued (SIGCONT from another process of its
        user, a shell's `fg`) computed beside the job whose turn it was until its own turn came: it is stopped
        again."""
        node = self.node
        for j in slicer.stopped():
            job = node.jobs[j]
            if slicer.entries[j].frozen:
                if not node.sup.stopped_outside(job):
                    slicer.thawed(j, now)
            elif job.stopped_by_gmux and node.sup.running(job) and node.sup.stop(job, again=True):
                if now - self._restopped.get(j, -RESTOP_TOLD_S) >= RESTOP_TOLD_S:
                    self._restopped = {k: t for k, t in self._restopped.items() if now - t < RESTOP_TOLD_S}
                    self._restopped[j] = now
                    node.decide(slicer.gpu, "stop", [j], {**self._numbers(slicer, job, now), "again": True},
                                f"GPU {slicer.gpu}: {j} was continued by someone else (SIGCONT) while gmuxd held "
                                f"it out of its turn: stopped again until its turn" + _keeps_beside(slicer, job))
        for j in sorted(j for j in slicer.resident if slicer.computing(j)):
            job = node.jobs[j]
            if not job.stopped_by_gmux and node.sup.stopped_outside(job, signal_only=True):
                slicer.frozen(j, now)
                node.decide(slicer.gpu, "stop", [j], {**self._numbers(slicer, job, now), "outside": True},
                            f"GPU {slicer.gpu}: {j} was found stopped by someone else (SIGSTOP, Ctrl-Z) while "
                            f"it computed: it gets no turns until it is continued (SIGCONT)"
                            + _keeps_beside(slicer, job))

    def continue_all(self) -> None:
        """At shutdown: a job left stopped would never run again. Continued, it waits at its next boundary."""
        for job in self.node.jobs.values():
            if job.stopped_by_gmux and not job.final:
                self.node.sup.cont(job)
                job.stopped_by_gmux = False


def _kept(slicer: Slicer, job: Job) -> str:
    """What a stopped job keeps on its GPU, in words: a job alone on its GPU may be stopped before its size is
    known (it was shown keeping 0B)."""
    mem = slicer.entries[job.id].mem
    return format_size(mem) if mem is not None else "its memory (size not known)"


def _keeps_beside(slicer: Slicer, job: Job) -> str:
    """What a stopped job keeps on its GPU, and beside which jobs."""
    others = [j for j in slicer.entries if j != job.id and not slicer.entries[j].held]
    return f"; it keeps {_kept(slicer, job)} on the GPU" + (f", beside which {', '.join(others)} run" if others else "")
