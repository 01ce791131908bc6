"""Moves of a job between this machine's GPUs in the job's own process: no checkpoint, no new interpreter.

A job on a virtual GPU computes on the CPU; what puts it "on GPU 1" is gmuxd's accounting (the GPU's slicer seat,
whose memory budget it counts against) and its environment (GMUX_VIRTUAL_GPU). So a move is a time slice that
ends on one GPU and begins on another: the job suspends at its next boundary (its memory tier copies its state to
host memory and frees it, as at any switch), its seat moves from the source GPU's slicer to the target's, and the
target's slicer resumes it in its turn, with the target's environment, which the job puts in its os.environ
(gmux.job.job). Its process, interpreter, model and data position stay as they are, so any job that can be
suspended moves this way, transparent mode too (a new process could not restore its data position). A job
already suspended (its turn is over, or its user holds it) moves at once: only its seat moves.

Between real GPUs the process's CUDA context, its allocator's reservations and the device of every tensor belong
to the GPU it started on (gmuxd pins it with CUDA_VISIBLE_DEVICES, read once). Where gmuxd was started with
--rebind-gpus, the CUDA driver moves them (gmux.node.cuda_rebind): once the job has suspended, the driver
checkpoints what its process still holds on the source GPU and restores it onto the target, same chip, same
device addresses; then the seat moves as above. A rebind that fails leaves the process on its source GPU, where
it resumes in its turn, and that job's later moves take the checkpoint-and-new-process path (Daemon.migrate), as
every move between real GPUs does without --rebind-gpus. Gangs and jobs holding GPUs of their own are refused
before this (their process groups are bound to devices).

While the job suspends, its source slicer is busy with "move" and waits, as for a migration: the job's memory
is in use there until it has left (and with "rebind" while the driver moves it). Once the job has suspended, the
target is checked again (admission's move_refusal: a multi-GPU job may have claimed it meanwhile, or the job's
measured working set may have grown past it); when it cannot take the job, the job stays on its source,
suspended, and resumes there in its turn. A job that has not suspended by its deadline (no boundary, or stuck in
a mini-batch) has its move given up, its suspend left to the source's slicer as one of its own. Only one slicer
holds the job at any moment, so a job that ends mid-move leaves nothing on either GPU.
"""
from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Callable, Optional

from gmux.node.cuda_rebind import RUNNING, STATE_NAMES, CudaDriver, Driver, DriverError, Rebinding, Unavailable, \
    put_back, rebind, uuid_bytes
from gmux.node.jobs import Job
from gmux.node.slicer import Slicer
from gmux.util.sizes import format_size
from gmux.wire.server import Request

if TYPE_CHECKING:
    from gmux.node.daemon import Daemon

PATH = "in process"     # what replies and decisions call this kind of move

log = logging.getLogger("gmux.moves")


class Moves:
    def __init__(self, node: "Daemon", driver: Optional[Driver] = None,
                 load_driver: Callable[[], Driver] = CudaDriver.load):
        self.node = node
        self.driver = driver    # the CUDA driver's checkpoint API, with --rebind-gpus (None: no rebinding)
        # Without --rebind-gpus the driver is still needed once, by a gmuxd restarted after a predecessor that
        # had it and died mid-rebind: loaded then, and only then (an Unavailable if it cannot be).
        self._load_driver = load_driver
        self._to_put_back: Optional[Driver | Unavailable] = None
        self.rebinding: dict[str, tuple[Rebinding, int, float]] = {}   # job -> (the driver's work, target, latency)
        self.refused: dict[str, str] = {}    # jobs whose rebind failed -> why (they move with a new process)
        self.no_uuid: dict[int, str] = {}    # real GPUs the driver cannot be told about -> why (checked once)
        for g in node.gpus.values():
            if not g.virtual:
                try:
                    uuid_bytes(g.uuid)
                except ValueError as e:
                    self.no_uuid[g.index] = f"GPU {g.index}: {e}"

    def applies(self, job: Job, gpu: int, new_process: bool = False) -> bool:
        """Whether a move of the single-GPU job `job` to `gpu` is made in its own process (new_process: the user
        asked for the checkpoint-and-new-process path)."""
        return not new_process and self.refusal(job, gpu) is None

    def refusal(self, job: Job, gpu: int) -> Optional[str]:
        """Why `job` cannot move to `gpu` in its own process; None if it can (module docstring)."""
        src, dst = self.node.gpus[job.gpu], self.node.gpus[gpu]
        if src.virtual and dst.virtual:
            return None
        if src.virtual != dst.virtual:
            return "one GPU is virtual and the other is not"
        if self.driver is None:
            return "between real GPUs a job moves in its own process only where gmuxd runs with --rebind-gpus"
        if src.name != dst.name:
            return (f"GPU {src.index} is a {src.name} and GPU {dst.index} a {dst.name}: the CUDA driver restores a "
                    f"process only onto a GPU of the same chip")
        for g in (src, dst):
            if g.index in self.no_uuid:
                return self.no_uuid[g.index]
        if job.id in self.refused:
            return f"its last move in its own process failed ({self.refused[job.id]})"
        return None

    def start(self, job: Job, gpu: int, req: Optional[Request]):
        """Moves the started, idle (no command in flight) job to `gpu`: at once if it is suspended, else once it
        has suspended at its next boundary (with `req`, the reply waits for that)."""
        node, now, src = self.node, time.monotonic(), job.gpu
        slicer = node.slicers[src]
        data = {"job": job.id, "kind": "migrate", "gpu": gpu, "from": src, "path": PATH, "pid": job.pid}
        if job.id not in slicer.resident and node.gpus[src].virtual:
            self._seat(job, gpu, now)
            return {**data, "latency_s": 0.0, "suspended_already": True}
        job.target_gpu = gpu    # (admission counts it on both GPUs until it has left)
        if job.id not in slicer.resident:   # suspended already: only its process's CUDA state is left to move
            self._rebind(job, gpu, 0.0)
            node.decide(src, "migrate", [job.id], {"from": src, "to": gpu, "path": PATH},
                        f"moving {job.id} from GPU {src} to GPU {gpu} in its own process (pid {job.pid}): it is "
                        f"suspended; the CUDA driver rebinds it")
            return node.commands.defer(job.id, "migrate", req, data=data) if req is not None else None
        slicer.mark_busy(job.id, "move", now)
        node.commands.send(job, "suspend", {})
        job.detail = f"moving to GPU {gpu} in its own process: suspending at its next boundary"
        node.decide(src, "migrate", [job.id], {"from": src, "to": gpu, "path": PATH},
                    f"moving {job.id} from GPU {src} to GPU {gpu} in its own process (pid {job.pid}): suspending "
                    f"it at its next boundary")
        return node.commands.defer(job.id, "migrate", req, data=data) if req is not None else None

    def expire(self, slicer: Slicer, now: float) -> None:
        """Moves from this GPU whose job has not suspended by its deadline (gmux.node.pacing: a few mini-batches,
        at least a floor) are given up: a job with no boundary, or stuck in a mini-batch, would otherwise hold its
        source GPU's slicer for ever. Its suspend becomes the slicer's own (stopped when others need the GPU,
        resumed here once it has suspended)."""
        for job_id in slicer.overdue_busy("move", now):
            job = self.node.jobs[job_id]
            gpu, job.target_gpu = job.target_gpu, None
            waited, deadline = slicer.waited(job_id, now), slicer.deadline(job_id)
            slicer.busy_to_suspend(job_id)
            why = (f"it did not suspend within {waited:.1f} s (its deadline, {deadline:.1f} s: no mini-batch "
                   f"boundary reached, control: {job.last_report.get('control') or 'no boundary seen'}); it stays "
                   f"on GPU {slicer.gpu}, its suspend waiting for its next boundary as a time slice's does")
            job.detail = f"move to GPU {gpu} given up: {why}"
            self.node.decide(slicer.gpu, "migrate", [job_id], {"from": slicer.gpu, "to": gpu, "path": PATH,
                                                               "ok": False, "waited_s": round(waited, 3)},
                             f"move of {job_id} from GPU {slicer.gpu} to GPU {gpu} given up: {why}")
            self.node.commands.wake(job_id, "migrate", False, waited, why)

    def suspended(self, job: Job, ok: bool, error: Optional[str], latency: float) -> None:
        """The job answered the suspend of its move (ok: it holds no memory now): the move is completed, or
        given up with the job where it was."""
        node, now, src, gpu = self.node, time.monotonic(), job.gpu, job.target_gpu
        slicer = node.slicers[src]
        if not ok:
            slicer.clear_busy(job.id)    # it could not suspend: it still computes, where it was
            why = f"its suspend failed ({error}); it runs on GPU {src} as before"
        else:
            why = node.admission.move_refusal(job, gpu)
            if why is not None:
                slicer.suspended_here(job.id, now)
                why += f"; {job.id} stays on GPU {src}, suspended, and resumes there in its turn"
        if why is not None:
            job.target_gpu = None
            job.detail = f"move to GPU {gpu} given up: {why}"
            node.decide(src, "migrate", [job.id], {"from": src, "to": gpu, "path": PATH, "ok": False},
                        f"move of {job.id} from GPU {src} to GPU {gpu} given up: {why}")
            node.commands.wake(job.id, "migrate", False, latency, why)
            node.switch(slicer, now)
        elif not node.gpus[src].virtual:
            self._rebind(job, gpu, latency)    # (it stays counted on both GPUs until the driver is done)
        else:
            job.target_gpu = None
            self._seat(job, gpu, now)
            node.commands.wake(job.id, "migrate", True, latency)

    def _rebind(self, job: Job, gpu: int, latency: float) -> None:
        """The suspended job's process is rebound from its GPU to `gpu` by the driver, on a thread (`poll`)."""
        node, src = self.node, job.gpu
        # No deadline: the driver's calls end on their own. It holds no memory on the source now (a suspend
        # asked meanwhile is answered at once); the source's slicer waits for it before its next switch, as
        # for any command in flight, so it is never resumed there while the driver has it.
        node.slicers[src].suspended_here(job.id, time.monotonic(), busy="rebind")
        old, new, driver, pid = node.gpus[src].uuid, node.gpus[gpu].uuid, self.driver, job.pid
        node.store.save(job)    # (its target_gpu: a gmuxd restarted after a crash puts back what the driver held)
        self.rebinding[job.id] = (Rebinding(lambda: rebind(driver, pid, old, new)), gpu, latency)
        job.detail = f"moving to GPU {gpu} in its own process: the CUDA driver rebinds it from GPU {src}"

    def poll(self, now: float) -> None:
        """Rebinds the driver has finished: the seat moves, or the job stays on its source GPU."""
        for job_id, (work, gpu, latency) in list(self.rebinding.items()):
            if not work.done():
                continue
            del self.rebinding[job_id]
            job = self.node.jobs.get(job_id)
            if job is None or job.final or job.gpu is None:
                continue    # it ended meanwhile: finish() has cleared its seat and answered its request
            job.target_gpu = None
            took = now - work.started
            try:
                times = work.result()
            except Exception as e:   # noqa: BLE001 - RebindError, or a bug: either way the move is over
                self._rebind_failed(job, gpu, e, latency + took, now)
                continue
            self.node.slicers[job.gpu].clear_busy(job.id)
            self._seat(job, gpu, now, {k: round(v, 4) for k, v in times.items()})
            self.node.commands.wake(job.id, "migrate", True, latency + took)

    def _rebind_failed(self, job: Job, gpu: int, e: Exception, latency: float, now: float) -> None:
        node, src = self.node, job.gpu
        where = getattr(e, "where", "unknown")
        self.refused[job.id] = str(e)
        slicer = node.slicers[src]
        slicer.suspended_here(job.id, now)
        if where == "source":
            then = f"it stays on GPU {src}, suspended, and resumes there in its turn"
        else:
            # Resumed, its next CUDA call might block for ever or fail: its user decides.
            job.held = True
            slicer.hold(job.id)
            then = (f"its CUDA state could not be put back, so it is held, suspended on GPU {src}: `gmux resume` "
                    f"tries it there, `gmux kill` ends it")
        why = f"the CUDA driver did not rebind it: {e}; {then}; its next move takes a new process"
        job.detail = f"move to GPU {gpu} given up: {why}"
        node.decide(src, "migrate", [job.id], {"from": src, "to": gpu, "path": PATH, "ok": False, "where": where},
                    f"move of {job.id} from GPU {src} to GPU {gpu} given up: {why}")
        node.commands.wake(job.id, "migrate", False, latency, why)
        node.switch(slicer, now)

    def settle(self, timeout: float = 60.0) -> None:
        """Before gmuxd exits: waits for the driver's rebinds in flight (a process left locked would block at its
        next CUDA call) and carries out their outcome, so that the job table says where each job is."""
        end = time.monotonic() + timeout
        for work, _, _ in list(self.rebinding.values()):
            work.wait(max(0.0, end - time.monotonic()))
        self.poll(time.monotonic())

    def recover(self, job: Job) -> None:
        """A job of a previous gmuxd that may have died during its rebind: a process left locked by the driver
        is unlocked, one left checkpointed is restored onto its old GPU first (its next CUDA call would block for
        ever otherwise). Without --rebind-gpus only a job whose record says a move was under way is checked."""
        gpu = self.node.gpus.get(job.gpu)      # None: a GPU this gmuxd does not have (started with fewer)
        if not job.pid or gpu is None or gpu.virtual:
            return
        driver = self.driver or (self._driver_to_put_back(job) if job.target_gpu is not None else None)
        if driver is None:
            return
        try:
            state = put_back(driver, job.pid)
        except DriverError as e:
            log.info("%s: its CUDA state could not be checked or put back: %s", job.id, e)
            return
        if state != RUNNING:
            log.warning("%s: its CUDA state was left %s by a rebind the previous gmuxd did not finish; put back and "
                        "unlocked", job.id, STATE_NAMES[state])

    def _driver_to_put_back(self, job: Job) -> Optional[Driver]:
        """The driver without --rebind-gpus, loaded at the first job that may need it; None (said, for `job`)
        where it cannot be."""
        if self._to_put_back is None:
            try:
                self._to_put_back = self._load_driver()
            except Unavailable as e:
                self._to_put_back = e
        if isinstance(self._to_put_back, Unavailable):
            log.warning("%s was moving to GPU %s when the previous gmuxd stopped; if that gmuxd ran with "
                        "--rebind-gpus, its process may be left locked by the CUDA driver, and it cannot be "
                        "checked: %s", job.id, job.target_gpu, self._to_put_back)
            return None
        return self._to_put_back

    def _seat(self, job: Job, gpu: int, now: float, rebind_s: Optional[dict] = None) -> None:
        """The suspended job's seat moves: it leaves the source's slicer (its GPU time goes with it) and joins
        the target's, which resumes it in its turn with the target's environment."""
        node, src = self.node, job.gpu
        node.leave_gpu(job, now)
        job.gpu = gpu
        node.seat(job, now)
        job.migrations += 1
        target = node.slicers[gpu]
        others = sorted(j for j in target.resident if j != job.id)
        then = ("it stays suspended, held by its user" if job.held else
                f"it resumes there in its turn, after {', '.join(others)}" if others else "it resumes there now")
        job.detail = f"moved in process from GPU {src} to GPU {gpu}"
        node.store.save(job)
        numbers = {"from": src, "to": gpu, "path": PATH, "pid": job.pid, "host_bytes": job.host_bytes}
        rebound = ""
        if rebind_s is not None:
            numbers["rebind_s"] = rebind_s
            rebound = f"; its CUDA context rebound by the driver in {sum(rebind_s.values()):.2f} s"
        node.decide(gpu, "moved", [job.id], numbers,
                    f"moved {job.id} in process from GPU {src} to GPU {gpu} (pid {job.pid}, no new interpreter; "
                    f"{format_size(job.host_bytes)} of state in host memory{rebound}): {then}")
        # Both GPUs act now rather than at the next tick: the source's next job, the mover's resume.
        node.switch(node.slicers[src], now)
        node.switch(target, now)
