"""Moves of a job between this machine's virtual GPUs in the job's own process: no checkpoint, no new interpreter.

A job on a virtual GPU computes on the CPU; what puts it "on GPU 1" is gmuxd's accounting (the GPU's slicer seat,
whose memory budget it counts against) and its environment (GMUX_VIRTUAL_GPU). So a move is a time slice that
ends on one GPU and begins on another: the job suspends at its next boundary (its memory tier copies its state to
host memory and frees it, as at any switch), its seat moves from the source GPU's slicer to the target's, and the
target's slicer resumes it in its turn, with the target's environment, which the job puts in its os.environ
(gmux.job.job). Its process, interpreter, model and data position stay as they are, so any job that can be
suspended moves this way, transparent mode too (a new process could not restore its data position). A job
already suspended (its turn is over, or its user holds it) moves at once: only its seat moves.

Real GPUs keep the checkpoint-and-new-process path (Daemon.migrate): gmuxd pins a job to its GPU with
CUDA_VISIBLE_DEVICES, which CUDA reads once, when the process initialises it. The process's CUDA context, the
memory its allocator reserved and the device of every tensor (torch.device("cuda:0") in that process) belong to
the GPU it started on; nothing in the process can be pointed at another device honestly, so a new process it is.
Gangs and jobs holding GPUs of their own are refused before this (their process groups are bound to devices).

While the job suspends, its source slicer is busy with "move" and waits, as for a migration: the job's memory
is in use there until it has left. Once the job has suspended, the target is checked again (admission's
move_refusal: a multi-GPU job may have claimed it meanwhile, or the job's measured working set may have grown
past it); when it cannot take the job, the job stays on its source, suspended, and resumes there in its turn.
A job that has not suspended by its deadline (no boundary, or stuck in a mini-batch) has its move given up,
its suspend left to the source's slicer as one of its own. Only one slicer holds the job at any moment, so a
job that ends mid-move leaves nothing on either GPU.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Optional

from gmux.node.inventory import Gpu
from gmux.node.jobs import Job
from gmux.node.slicer import Slicer
from gmux.util.sizes import format_size
from gmux.wire.server import Request

if TYPE_CHECKING:
    from gmux.node.daemon import Daemon

PATH = "in process"     # what replies and decisions call this kind of move


def in_process(src: Gpu, dst: Gpu) -> bool:
    """Whether a job moves from `src` to `dst` in its own process: between virtual GPUs only (module docstring)."""
    return src.virtual and dst.virtual


class Moves:
    def __init__(self, node: "Daemon"):
        self.node = node

    def applies(self, job: Job, gpu: int, new_process: bool = False) -> bool:
        """Whether a move of the single-GPU job `job` to `gpu` is made in its own process (new_process: the user
        asked for the checkpoint-and-new-process path)."""
        return not new_process and in_process(self.node.gpus[job.gpu], self.node.gpus[gpu])

    def start(self, job: Job, gpu: int, req: Optional[Request]):
        """Moves the started, idle (no command in flight) job to `gpu`: at once if it is suspended, else once it
        has suspended at its next boundary (with `req`, the reply waits for that)."""
        node, now, src = self.node, time.monotonic(), job.gpu
        slicer = node.slicers[src]
        data = {"job": job.id, "kind": "migrate", "gpu": gpu, "from": src, "path": PATH, "pid": job.pid}
        if job.id not in slicer.resident:
            self._seat(job, gpu, now)
            return {**data, "latency_s": 0.0, "suspended_already": True}
        job.target_gpu = gpu    # (admission counts it on both GPUs until it has left)
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
        job.target_gpu = None
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
            job.detail = f"move to GPU {gpu} given up: {why}"
            node.decide(src, "migrate", [job.id], {"from": src, "to": gpu, "path": PATH, "ok": False},
                        f"move of {job.id} from GPU {src} to GPU {gpu} given up: {why}")
            node.commands.wake(job.id, "migrate", False, latency, why)
            node.switch(slicer, now)
            return
        self._seat(job, gpu, now)
        node.commands.wake(job.id, "migrate", True, latency)

    def _seat(self, job: Job, gpu: int, now: float) -> None:
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
        node.decide(gpu, "moved", [job.id], {"from": src, "to": gpu, "path": PATH, "pid": job.pid,
                                             "host_bytes": job.host_bytes},
                    f"moved {job.id} in process from GPU {src} to GPU {gpu} (pid {job.pid}, no new interpreter; "
                    f"{format_size(job.host_bytes)} of state in host memory): {then}")
        # Both GPUs act now rather than at the next tick: the source's next job, the mover's resume.
        node.switch(node.slicers[src], now)
        node.switch(target, now)
