"""The in-job runtime: one `Job` per training process, driven at mini-batch boundaries.

The job decides nothing. At each boundary it records how long the mini-batch took, asks its controller
for a pending command and carries it out: suspend (then wait, suspended, until told to resume, checkpoint,
spill its host copy to disk or exit), checkpoint, migrate (checkpoint, then exit), exit. Between boundaries
it costs nothing. A resume may put the job on another virtual GPU than the one it left (a move in its own
process): the command's environment says which.

A suspend `in_place` (a cross-machine move's: gmux.node.cluster_link) holds the job at its boundary without
copying its state out: the move's checkpoint is written from live memory, and a move that fails resumes it with
nothing to copy back. Its memory stays where it is (gmuxd's slicer counts it as kept) until it resumes, exits,
or is told to suspend for real.
"""
from __future__ import annotations

import contextlib
import io
import os
import sys
import time
import weakref
from typing import Any, BinaryIO, Callable, Iterable, Iterator, Optional

import torch

from . import checkpoint as ckpt, held_signals, holdings, loop_carried, movability, own_threads, sparse_tensors
from .checkpoint_pipe import is_fifo, stream
from .control import Command, Controller, LocalController
from .data import DataPosition, Reading, batches, epochs, own_epochs
from .data_epoch import Epoch, count_restarts
from .memory import choose_tier
from .memory.tier import exact_device
from .memory.limit import adopt, host_memory
from .profile import Profile
from .restore_check import Fit
from .state import TrackedState
from .step_starts import StepStarts

REPORT_EVERY_S = 1.0
NOTHING_COPIED = {"in_place": True, "bytes": 0, "total_s": 0.0}   # a suspend's or resume's figures, in place


class JobExit(SystemExit):
    """Raised at a boundary when the job was told to exit or migrate; its state is already safe."""


class Job:
    def __init__(self, tracked: TrackedState, controller: Optional[Controller] = None,
                 pool=None, device: Optional[torch.device | str] = None,
                 discover: Optional[Callable[["Job"], None]] = None):
        self.tracked = tracked
        self.controller: Controller = controller if controller is not None else LocalController()
        self.device = exact_device(device) if device is not None else _device_of(tracked)
        self.tier = choose_tier(self.device, pool)   # its memory tier (gmux/job/memory/tier.py)
        self.position = DataPosition()
        self.profile = Profile(self.device)
        self._discover = discover
        self._last = time.perf_counter()
        self._next_report = self._last + REPORT_EVERY_S
        self._in_place = False          # suspended in place: held at a boundary, its memory where it was
        self._held = None               # a move asked for at a boundary no new process could resume from
        self.under_suspend = False      # see _held_by_driver
        self.unchanged = holdings.Unchanged(tracked.modules)   # what a move's checkpoint may leave out
        # Whether a checkpoint may leave out the gradients' values (see `checkpoint`); GMUX_GRADS=overwritten
        # says so for a script that cannot set it (gmux-launch, gmux submit --env).
        self.grads_overwritten = os.environ.get("GMUX_GRADS") == "overwritten"
        # How the job's boundaries come (reported; `gmux ps` shows it): "explicit" for a script that attached
        # itself; transparent mode (hook.py) says "none yet", then "optimizer hook" or "module hook".
        self.control = "explicit"
        self.loop_watch = None          # the transparent hook's watch of the training loop (hook.py), while it marks
        # What a framework does when its process leaves at this boundary (a move, a spill), once the checkpoint
        # is safe: what it would have done after the boundary and must not lose (Lightning: the step's log row)
        self.on_leave: Optional[Callable[[], None]] = None
        self.at_attach = movability.layout(self)     # what a new process's attach() finds (movability)
        self.not_rebuilt: Optional[str] = None     # why a new process would not rebuild this state (api.attach)
        self.strays: weakref.WeakSet = weakref.WeakSet()   # optimizers that stepped outside its state (strays.py)
        self.step_starts = StepStarts()     # which of job.data's fetches a move may fall at
        me = weakref.ref(self)
        os.register_at_fork(after_in_child=lambda: (job := me()) is not None and job._forked())

    def stop_watching_loop(self) -> None:
        """The script (attach()) or its framework marks the boundaries from here: the hook's watch ends."""
        if self.loop_watch is not None:
            self.loop_watch.close()
            self.loop_watch = None

    def _forked(self) -> None:
        """In a child forked from the job (a Hogwild worker, a DataLoader worker that calls a module), its
        boundaries are the child's own: it is not the job gmux controls, so it takes no command (suspending it
        would move tensors it shares with its parent) and leaves the parent's connection to gmuxd alone (kept
        referenced here, so the child never closes it)."""
        self._parents_controller, self.controller = self.controller, LocalController()

    def move_to(self, device: torch.device | str) -> None:
        """Tells the runtime which device the job's state lives on (transparent mode learns it late)."""
        if self.suspended:
            raise RuntimeError("cannot change the device of a suspended job")
        self.device = exact_device(device)
        self.tier = choose_tier(self.device, self.tier.pool)
        self.profile.device = self.device

    @property
    def state(self) -> dict:
        return self.tracked.state

    @property
    def suspended(self) -> bool:
        return self.tier.suspended

    # -- boundaries ----------------------------------------------------------------------------------------
    def boundary(self) -> None:
        """Marks the end of a mini-batch. With nothing pending: a timestamp and a non-blocking poll. Called inside
        a job.data loop, the script marks its boundaries from then on (job.data's fetches are not: gradient
        accumulation). Where a new process could not resume (the epoch's last batch, or any where its loader has no
        length; after the loop, in a validation through job.data: it would run again what came between the loop
        and here, or find none of the loop's variables), a move asked for waits for the epoch loader's next
        fetch (_take_held)."""
        position = self.position
        if position.current is not None:
            position.marked_by_script = True
        self._boundary(movable=position.movable())

    def _boundary(self, movable: bool = True) -> None:
        now = time.perf_counter()
        self.profile.batch_s.append(now - self._last)
        self.profile.steps += 1
        command = self.controller.poll()
        if not movable and command is not None and command.kind in ("checkpoint", "migrate"):
            self._held, command = command, None
        elif movable and command is None and self._held is not None:
            command, self._held = self._held, None
        if command is not None:
            self._carry_out(command)
            now = time.perf_counter()
        elif now >= self._next_report:
            self.tier.tidy()
            self._report(now)
        self._last = now

    def _boundary_from_iterator(self, movable: bool) -> None:
        # An explicit boundary() or the optimizer hook knows better (gradient accumulation); defer to it.
        if not self.position.marked_by_script:
            self._boundary(movable)

    def epochs(self, count: int) -> Iterator[int]:
        """`for epoch in job.epochs(n)`: continues from the restored epoch."""
        return epochs(self.position, count, self.tracked)

    def data(self, loader: Iterable) -> Iterator[Any]:
        """One epoch of `loader`, with its position tracked; marks a boundary before each fetch that begins a step
        (step_starts) unless the script marks them itself. Iterated again once read to its end, it reads `loader`
        again (Epoch)."""
        return self._epoch(loader, False, sys._getframe(1))

    def _epoch(self, loader: Iterable, counted: bool, site) -> Epoch:
        reading = Reading()
        return Epoch(batches(self.position, loader, self._boundary_from_iterator, self.tracked, reading,
                             lambda: self._held is not None, self._take_held,
                             lambda: self.step_starts.fetch(bool(self.tracked.optimizers))), reading,
                     lambda: self._epoch(loader, counted, None), self.position, counted, site, loader)

    def _take_held(self) -> None:
        """The epoch loader's next batch is fetched, not yet given to the script: a move held at a boundary no new
        process could resume from (the epoch's last batch, any batch of a loader with no length, after the
        loop) is taken here, where the epoch has a batch left. A new process replays the epoch to the batch
        before and fetches this one again, under the random streams it was first fetched under."""
        command, self._held = self._held, None
        self._carry_out(command)

    def enumerate(self, loader: Iterable) -> Iterator[tuple[int, Any]]:
        """`for i, batch in job.enumerate(loader)`: job.data with each batch's index in its epoch, which goes on
        from where a restore put the epoch (enumerate() would count from 0 again)."""
        return self._epoch(loader, True, sys._getframe(1))

    def _report(self, now: float) -> None:
        self._next_report = now + REPORT_EVERY_S
        self.controller.report(self.report())

    def report(self) -> dict:
        if self._discover is not None and not self.suspended and self.control != "framework":
            # A hooked job's model and its buffers count before the first command finds them. (A framework's
            # own discovery reads its Trainer's counters, for commands only: after training they are gone.)
            self._discover(self)
        tracked = 0 if self.suspended else _storage_bytes(self.tracked.tensors())
        report = self.profile.report(tracked)
        report.update(self.tier.memory())   # the allocator tier's tracker: live at boundary, peak, by tag
        report["control"] = self.control
        report.update(movability.report(self))
        return report

    # -- commands ------------------------------------------------------------------------------------------
    def _carry_out(self, command: Command) -> None:
        if self._discover is not None:
            self._discover(self)
        if command.kind == "suspend":
            with self._held_by_driver():
                if self._answer(command, lambda: self._suspend_as_told(command)):
                    self._while_suspended()
        elif command.kind in ("resume", "spill"):
            self.controller.reply(command, {"ok": False, "error": f"{command.kind}: the job is not suspended"})
        elif command.kind in ("checkpoint", "migrate"):
            self._write_checkpoint(command)
        elif command.kind == "exit":
            self.controller.reply(command, {"ok": True})
            raise JobExit(0)

    @contextlib.contextmanager
    def _held_by_driver(self):
        """Around a suspend, from its first copy to its resume's last, where the script's own code must not run (its
        state is off the device): a driver's `while_held` says what a Ctrl-C does (gmux-launch's ends the job), the
        script's signal handlers wait (gmux.job.held_signals), as do its threads' reads (gmux.job.own_threads)."""
        self.under_suspend = True
        try:
            with held_signals.deferred(), own_threads.suspending(), \
                    getattr(self.controller, "while_held", contextlib.nullcontext)():
                yield
        finally:
            self.under_suspend = False

    def _while_suspended(self) -> None:
        while True:
            command = self.controller.wait()
            if command is None:
                continue
            if command.kind == "resume":
                if self._answer(command, lambda: self._resume_as_told(command)):
                    return
            elif command.kind in ("checkpoint", "migrate"):
                self._write_checkpoint(command)
            elif command.kind == "spill":
                self._answer(command, lambda: self.spill(_target(command)))
            elif command.kind == "suspend" and self._in_place:
                self._answer(command, self._suspend_held)
            elif command.kind == "exit":
                self.controller.reply(command, {"ok": True, "suspended": True})
                raise JobExit(0)
            else:
                self.controller.reply(command, {"ok": False, "error": f"{command.kind}: the job is suspended"})

    def _suspend_as_told(self, command: Command) -> dict:
        if command.args.get("in_place"):
            self._in_place = True
            return dict(NOTHING_COPIED)
        return self.suspend()

    def _suspend_held(self) -> dict:
        """Held in place and told to suspend (gmuxd needs its memory: a move in its own process, say): now for
        real."""
        figures = self.suspend()
        self._in_place = False
        return figures

    def _resume_as_told(self, command: Command) -> dict:
        """resume, on the GPU the command names: gmuxd may resume the job on another virtual GPU than the one it
        left (a move in its own process, gmux.node.moves), and the command's environment (GMUX_VIRTUAL_GPU, its
        memory budget) says which, to this process and to whatever in it reads the environment. Applied only
        once the job runs again (a failed resume changes nothing)."""
        if self._in_place:
            self._in_place = False
            self._last = time.perf_counter()    # (time held is not a mini-batch)
            figures = dict(NOTHING_COPIED)
        else:
            figures = self.resume()
        os.environ.update(command.args.get("env") or {})
        if command.args.get("gpu") is not None:
            figures["gpu"] = command.args["gpu"]
        return figures

    def _write_checkpoint(self, command: Command) -> None:
        """checkpoint, or migrate: checkpoint and leave (only once the state is safely written)."""
        def write() -> dict:
            if command.kind == "migrate":
                self._check_rebuildable()
            figures = self.checkpoint(_target(command), command.args.get("holds") or b"")
            warning = "; ".join(filter(None, (count_restarts(self.position.current), own_epochs(self.position),
                                              loop_carried.warning(self, sys._getframe()))))
            if warning and command.kind == "migrate":    # (the job's log says it too: most moves are gmuxd's own)
                print(f"gmux: moved to a new process: {warning}", file=sys.stderr, flush=True)
            return {**figures, "warning": warning} if warning else figures
        if self._answer(command, write) and command.kind == "migrate":
            if self.on_leave is not None:
                try:
                    self.on_leave()
                except Exception as e:     # (the checkpoint is written and the move answered: leave regardless)
                    print(f"gmux: leaving this process, {e!r}", file=sys.stderr, flush=True)
            raise JobExit(0)

    def _check_rebuildable(self) -> None:
        """Refused here, while the job can still run on where it is (gmux.job.movability says why)."""
        problem = movability.problem(self, fresh=True)
        if problem:
            raise RuntimeError(problem)

    def _answer(self, command: Command, action: Callable[[], dict]) -> bool:
        try:
            figures = action()
        except Exception as e:  # the job keeps its last good state; the driver hears why
            path = command.args.get("path")
            # (a write that failed on a full disk says "No space left on device", and not where)
            error = f"{path}: {e.strerror}" if isinstance(e, OSError) and not e.filename and path and e.strerror \
                else str(e)
            self.controller.reply(command, {"ok": False, "error": error})    # (each hearer says what failed)
            if command.kind in ("checkpoint", "migrate"):     # (the script's own log says why it was not moved)
                print(f"gmux: {'move' if command.kind == 'migrate' else 'checkpoint'} refused, the job runs on "
                      f"here: {error}", file=sys.stderr)
            return False
        self.controller.reply(command, {"ok": True, **figures})
        return True

    # -- the operations, callable directly at a boundary -----------------------------------------------------
    def suspend(self) -> dict:
        figures = self.tier.suspend(self.tracked.tensors())
        self.profile.suspends += 1
        self.profile.suspend_s += figures["total_s"]
        self.profile.bytes_moved += figures["bytes"]
        self.profile.last_suspend = figures
        return figures

    def resume(self) -> dict:
        figures = self.tier.resume()
        self.profile.resume_s += figures["total_s"]
        self.profile.bytes_moved += figures["bytes"]
        self.profile.last_resume = figures
        # Time spent suspended is not a mini-batch.
        self._last = time.perf_counter()
        return figures

    def spill(self, path: str) -> dict:
        """While suspended: moves the host copy of the state to a file at `path`, freeing its host memory."""
        if self._in_place:
            raise RuntimeError("the job is held in place (a move's suspend): it has no host copy to spill")
        figures = self.tier.spill(path)
        self.profile.spills += 1
        return figures

    def snapshot(self) -> dict:
        snap = self.tracked.capture(self.suspended)
        # (a restored epoch still to be replayed: the streams and state= as the checkpoint restored from holds them,
        # which the replay puts back; the script's top, run again meanwhile, drew from others)
        if self.position.at_checkpoint is not None:
            snap.update(self.position.at_checkpoint)
        if self.position.state_at_checkpoint is not None:
            snap["state"] = {**snap["state"], **self.position.state_at_checkpoint}
        snap["position"] = self.position.to_dict()
        snap["steps"] = self.profile.steps
        return snap

    def checkpoint(self, target: str | BinaryIO | Callable[[bytes], Any], holds: bytes = b"") -> dict:
        """Writes the job's state to a path (atomically), a binary file or a byte sink.

        `holds`: digests a move's new process offers (gmux.job.holdings); the tensors it holds are left out.
        Only a stream (a move's) leaves them out: a file must restore anywhere.

        With `grads_overwritten` set, the gradients' values are not written, only which parameters have one
        and its shape: a restore gives them zeros. That is bit-identical to sending them when the job's loop
        zeroes its gradients (optimizer.zero_grad() or model.zero_grad(), set_to_none either way) after every
        boundary before its next backward, and reads none of them before that: an existing gradient is then
        set to zeros (or None) whatever it held. It holds for every boundary at an optimizer step (gmux-launch's
        hook; job.boundary() or job.data() once per step) with the usual zero_grad-backward-step loop, for any
        optimizer, and for gradient accumulation whose boundaries fall only at optimizer steps. It does not
        hold at a boundary between micro-batches of an accumulation cycle (the next backward adds to the
        gradients), nor for a loop that reads last step's gradients first (logging their norm, say)."""
        t0 = time.perf_counter()
        def resolve(t: torch.Tensor) -> torch.Tensor:  # a suspended tensor's values are in its host copy
            view = self.tier.host_view(t) if self.suspended else None
            return t if view is None else view
        if self.device.type == "cuda" and not self.suspended:
            torch.cuda.synchronize(self.device)
        snap = self.snapshot()
        if self.grads_overwritten:
            snap["grads"] = [{name: ckpt.Zeros(g) for name, g in grads.items()} for grads in snap["grads"]]
        if isinstance(target, (str, os.PathLike)) and is_fifo(target):
            held = self.unchanged.held(holdings.parse(holds), resolve) if holds else None
            nbytes = stream(snap, os.fspath(target), resolve, held)
        elif isinstance(target, (str, os.PathLike)):
            nbytes = ckpt.save(snap, os.fspath(target), resolve)
        else:
            nbytes = ckpt.write(snap, target.write if hasattr(target, "write") else target, resolve)
        # The step it holds: the job goes on stepping once it is written, so a later report's is not it.
        return {"bytes": nbytes, "seconds": time.perf_counter() - t0, "step": snap["steps"]}

    def restore(self, source: str | BinaryIO | bytes, fresh: bool = False,
                offer: Optional[holdings.Offer] = None) -> dict:
        """Puts a checkpoint's state into this job's objects, or raises CheckpointError without changing
        anything: the checkpoint is checked against this job (restore_check.Fit) before its data is read, and
        its random states are tried on scratch generators before anything is applied.

        `fresh`: this process only just built its state, and ends if the restore fails (a move's target), so
        the parameters and buffers it holds on the host are read into directly, not copied in afterwards; a
        refused checkpoint leaves them undefined. `offer`: what this process offered its move's source; the
        tensors the stream left out as held are taken from it."""
        if self.suspended:
            raise RuntimeError("restore: resume the job first")
        t0 = time.perf_counter()
        # The checkpoint's buffers are read as host memory, outside the job's memory limit (its live state is
        # counted already: a restore must not need twice the limit); what the job keeps of them, its optimizer
        # state, is counted once applied (limit.adopt).
        with host_memory():
            if isinstance(source, (str, os.PathLike)):
                origin = repr(os.fspath(source))
                fit = Fit(self, origin)
                snap = ckpt.load(os.fspath(source), fit.layout)
            else:
                origin = repr(source.name) if isinstance(getattr(source, "name", None), str) else "(stream)"
                fit = Fit(self, origin)
                stream = io.BytesIO(source) if isinstance(source, (bytes, bytearray)) else source
                snap = ckpt.read(stream, origin, fit.layout, fit.into if fresh else None,
                                 offer.find if offer is not None else None)
        fit.values(snap)
        position = DataPosition.from_dict(snap["position"])
        own = self.tracked.streams() if position.replay else None
        self.tracked.apply(snap)
        if own is not None:
            # The script runs on from here to its loop as the first process ran from its attach, drawing from the
            # streams as they were then (a probe, a fixed noise): they stay this process's own until the loop's
            # replay (gmux.job.data) puts the checkpoint's back. Set now, those draws took the checkpoint's.
            position.at_checkpoint = self.tracked.streams()
            self.tracked.set_streams(own)
        self.unchanged.mark()
        adopt([part for t in self.tracked.tensors() for part in sparse_tensors.parts(t)])   # (a sparse gradient's)
        position.attached_at, self.position = self.position.attached_at, position
        if again := own_epochs(position):
            print(f"gmux: restored: {again}", file=sys.stderr)
        self.profile.steps = snap["steps"]
        # Its first boundary after the restore reports at once: a move's source holds the job until gmuxd hears
        # it (gmux.node.cluster_link), and a regular report could be a second away.
        self._next_report = 0.0
        return {"seconds": time.perf_counter() - t0}

    def residue(self) -> dict:
        """Device memory still held while suspended, by name: what the runtime does not track."""
        from .residue import residue
        return residue(self)


def _target(command: Command):
    target = command.args.get("path") or command.args.get("sink")
    if target is None:
        raise ValueError(f"{command.kind} needs a 'path'")
    return target


def _device_of(tracked: TrackedState) -> torch.device:
    for m in tracked.modules:
        for p in m.parameters():
            return p.device
    for t in tracked.extras.values():
        return t.device
    return torch.device("cpu")


def _storage_bytes(tensors: list[torch.Tensor]) -> int:
    seen, total = set(), 0
    for t in (part for t in tensors for part in sparse_tensors.parts(t)):
        s = t.untyped_storage()
        if s.data_ptr() not in seen:
            seen.add(s.data_ptr())
            total += s.nbytes()
    return total
