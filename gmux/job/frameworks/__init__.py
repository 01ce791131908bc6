"""Framework-aware explicit mode: a script that trains with Hugging Face `Trainer` or Lightning `Trainer`, run
unmodified under gmux-launch, becomes an explicit-mode job through the framework's own hooks.

Nothing here imports a framework. `install(job)` (the launcher calls it after the transparent hook) puts a
finder on `sys.meta_path` that notices when the script imports the module defining a `Trainer` and patches that
class as the module finishes loading (huggingface.py: `Trainer.train`; lightning.py: `Trainer.fit`). When the
script then trains, the patched method adds a callback of the framework's kind, which at the start of training
hands the job the framework's objects (model, optimizer, LR scheduler, AMP scaler) in place of what the
transparent hook would have guessed, stops the transparent hook (its optimizer-step boundaries fall inside the
framework's step, before its scheduler steps and its counters move), and marks a boundary at the end of each of
the framework's steps. What the framework itself keeps (its counters, callbacks' states, where its data loader
is) is refreshed into the job's `state` before every command, so a checkpoint holds all of it; a restored
process continues through the framework's own resume path, fed from that checkpoint.

Whether the job can move (continue exactly in a new process) is decided once its Trainer has started, from its
setup (each framework's `why_not_movable`); the job reports it (`movable`, and `unmovable`: why not), gmuxd
lets it be migrated and spilled by exit only when it can, and says why when it cannot. Such a job is still
suspended and time-sliced in its process like any other.
"""
from __future__ import annotations

import importlib.abc
import os
import re
import sys
from typing import Callable, Optional

from gmux.job import movability

# module whose loading defines a framework's Trainer -> the gmux module that patches it
WATCHED = {
    "transformers.trainer": "huggingface",
    "lightning.pytorch.trainer.trainer": "lightning",
    "pytorch_lightning.trainer.trainer": "lightning",
}
# survives the launcher's re-exec after a move: the new process imports the framework before it registers
WARM_ENV = "GMUX_FRAMEWORK_MODULE"

_job = None
_restore: Optional[str] = None
_runs = 0           # Trainer runs started in this process


def install(job) -> None:
    """Watches for the frameworks' Trainers on behalf of `job` (the transparent hook's job). Idempotent."""
    global _job, _restore
    _job = job
    # A moved or spilled job's checkpoint: restored by the first Trainer that trains (once).
    _restore = os.environ.get("GMUX_RESTORE") or None
    if not any(isinstance(f, _Watch) for f in sys.meta_path):
        sys.meta_path.insert(0, _Watch())
    for name in WATCHED:
        if name in sys.modules:          # imported before gmux was installed (a sitecustomize, a plugin)
            _patch(name, sys.modules[name])


def job():
    return _job


def take_restore() -> Optional[str]:
    """The checkpoint to restore from, the first time it is asked for; None after that or if there is none."""
    global _restore
    path, _restore = _restore, None
    return path


def saved_state(path: str, framework: str) -> dict:
    """The `state` a framework job saved in its checkpoint at `path` (read before the Trainer has built the
    objects Job.restore checks the rest against)."""
    from gmux.job import checkpoint
    state = checkpoint.load(path)["state"]
    if state.get("framework") != framework:
        raise checkpoint.CheckpointError(path, f"was written by a {state.get('framework') or 'non-framework'} job, "
                                               f"not by a {framework} Trainer")
    return state


def attach(job, framework: str, objects: list, why_not_movable: Optional[str], refresh: Callable[[], None],
           leaving: Optional[Callable[[], None]] = None) -> None:
    """Makes the framework's objects the job's state and its steps the job's boundaries; `leaving` is called
    when the process leaves at a boundary (Job.on_leave)."""
    from gmux.job.state import TrackedState
    job.stop_watching_loop()           # the framework's step end is the boundary from now on
    tracked = TrackedState()
    for obj in objects:
        if obj is None:
            continue
        try:
            tracked.add(obj)
        except TypeError:       # (a run of the script's own is never failed for what gmux cannot keep)
            why_not_movable = why_not_movable or (
                f"gmux cannot keep its {type(obj).__name__} (not a module, optimizer, GradScaler, nor an LR scheduler "
                f"with state_dict() and load_state_dict()): a new process would start it anew")
    tracked.state = {"framework": framework}
    job.tracked = tracked
    job.at_attach = movability.layout(job)       # (what a new process's restore, just after this, finds)
    first = next((p for m in tracked.modules for p in m.parameters()), None)
    if first is not None and first.device != job.device and not job.suspended:
        job.move_to(first.device)
    job.control = "framework"
    job._discover = lambda _job: refresh()   # before every command: the framework's counters into the state
    job.on_leave = leaving
    if why_not_movable is None and _runs > 1:
        why_not_movable = ("its script trained with a Trainer before in this process; a new process would train "
                           "that one again first")
    _say(job, {"movable": why_not_movable is None, "unmovable": why_not_movable, "framework": framework})
    module = next((k for k, v in WATCHED.items() if v == framework and k in sys.modules), None)
    if why_not_movable is None and module is not None:
        os.environ[WARM_ENV] = module   # for the process that continues this one after a move


# what a script's source says about the Trainer it will import: `from transformers import Trainer`,
# `import lightning.pytorch as pl`, `import lightning as L`, `import pytorch_lightning`
# (every pattern of an entry must match; an import of several names may span lines)
_USES = (("transformers.trainer", (re.compile(r"^\s*(from|import)\s+transformers\b", re.M),
                                   re.compile(r"\bTrainer\b"))),
         ("lightning.pytorch.trainer.trainer", (re.compile(r"^\s*(from|import)\s+lightning\b", re.M),)),
         ("pytorch_lightning.trainer.trainer", (re.compile(r"^\s*(from|import)\s+pytorch_lightning\b", re.M),)))


def _say(job, figures: dict) -> None:
    """The job's reports say whether it can move; gmuxd reads it (a framework job learns that only once its
    Trainer has started)."""
    job.framework_figures = figures
    if "report" not in job.__dict__:
        base = type(job).report
        job.report = lambda: {**base(job), **job.framework_figures}
    job._next_report = 0.0       # report at the next boundary, not a second from now


def started() -> None:
    """A Trainer starts training (counted: only a process's first can be resumed in a new process)."""
    global _runs
    _runs += 1


def finished(job) -> None:
    """The Trainer has returned: the script goes on without the framework's boundaries, and cannot move."""
    no_longer_movable(job, "its Trainer has finished training; the script goes on without boundaries")


def no_longer_movable(job, why: str) -> None:
    """From now on a move would not be exact: reported (gmuxd moves it no more), and refused by the job itself
    should a move be asked before gmuxd has read the report."""
    job.position.unmovable = why
    if getattr(job, "framework_figures", None) and job.framework_figures.get("movable"):
        _say(job, {**job.framework_figures, "movable": False, "unmovable": why})


def warm_up(script: Optional[str] = None) -> None:
    """Imports the framework the job's script trains with (transformers' Trainer costs seconds) before the
    launcher registers, so that the import is not spent on the GPU's turn: the one a moved job's previous process
    used, or the one the script's source imports. A wrong guess costs an import and changes nothing else."""
    names = [os.environ.get(WARM_ENV)]
    if script is not None:
        try:
            with open(script, encoding="utf-8", errors="replace") as f:
                source = f.read(1 << 20)
        except OSError:
            source = ""
        names += [name for name, patterns in _USES if all(p.search(source) for p in patterns)]
    for name in names:
        if name in WATCHED and name not in sys.modules:
            try:
                importlib.import_module(name)
            except ImportError:
                pass             # the script's own import will say what is missing


def _patch(name: str, module) -> None:
    patcher = importlib.import_module(f"{__name__}.{WATCHED[name]}")
    patcher.patch(module)


class _Watch(importlib.abc.MetaPathFinder):
    """Finds a watched module through the other finders and patches it once it has been executed."""

    def find_spec(self, name, path, target=None):
        if name not in WATCHED:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _Patching(spec.loader, name)
        return spec


class _Patching(importlib.abc.Loader):
    """The module's own loader, and the patch once the module is complete."""

    def __init__(self, loader, name: str):
        self._loader, self._name = loader, name

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        self._loader.exec_module(module)
        _patch(self._name, module)

    def __getattr__(self, attr):          # get_source, is_package, ... (tracebacks, inspect)
        return getattr(self._loader, attr)
