"""What a job is: the objects a training script attached, the tensors they own, and the random streams.

`TrackedState` enumerates every tensor the runtime moves on suspend (parameters, their gradients, buffers, the
counts of torchmetrics Metrics in the modules, optimizer state, extras) and captures the whole job as one nested
structure (`capture`) that the checkpoint format serialises and `apply` puts back, once gmux.job.restore_check has
found that it fits.
"""
from __future__ import annotations

import collections
import copy
import random
import weakref
from dataclasses import dataclass, field
from typing import Iterator, Optional

import numpy as np
import torch
from torch import nn

from . import generators as gens
from . import metric_states, module_attributes, optimizer_attributes, sparse_tensors, state_deques
from .checkpoint import CheckpointError


class StateMismatch(CheckpointError):
    """A sound checkpoint that does not fit the job it is restored into (another model, another optimizer...)."""


_SCHEDULERS = (torch.optim.lr_scheduler.LRScheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)


# By type (here and in hook.py): a weakref.proxy passes isinstance() while alive and raises once dead.
def _is_scheduler(obj) -> bool:
    return issubclass(type(obj), _SCHEDULERS)


def _keeps_its_own_state(obj) -> bool:
    """An object of another kind that saves and loads its state as torch's schedulers do (timm's schedulers, one
    of the script's own): kept with the schedulers, by its state_dict()."""
    return callable(getattr(type(obj), "state_dict", None)) and callable(getattr(type(obj), "load_state_dict", None))


def _is_scaler(obj) -> bool:
    return issubclass(type(obj), torch.amp.GradScaler)


class _WeakMembers:
    """The modules (or optimizers, ...) a script owns, found rather than attached: one the script has dropped
    leaves the job (a k-fold loop's earlier models, an optimizer made again each epoch), rather than being kept
    alive by gmux and moved at every suspend."""

    def __init__(self, given=()):
        self._refs: list = [weakref.ref(o) for o in given]

    def append(self, obj) -> None:
        self._refs.append(weakref.ref(obj))

    def _live(self) -> list:
        live = [r() for r in self._refs]
        if None in live:
            self._refs = [r for r, o in zip(self._refs, live) if o is not None]
        return [o for o in live if o is not None]

    def __iter__(self):
        return iter(self._live())

    def __len__(self) -> int:
        return len(self._live())

    def __getitem__(self, i):
        return self._live()[i]


@dataclass
class TrackedState:
    modules: list = field(default_factory=list)
    optimizers: list = field(default_factory=list)
    schedulers: list = field(default_factory=list)
    scalers: list = field(default_factory=list)
    extras: dict = field(default_factory=dict)
    state: dict = field(default_factory=dict)
    extras_layout: Optional[dict] = None    # (set_extras) each extra tensor's name -> (dtype, shape) at attach
    generators: list = field(default_factory=list)    # the script's own random generators (generators.py)
    weak: bool = False      # transparent mode: found objects stay only as long as the script keeps them
    added: int = 0          # objects added so far (a discovery is over once nothing was added since)

    def __post_init__(self):
        if self.weak:
            self.modules, self.optimizers, self.schedulers, self.scalers = (
                _WeakMembers(given) for given in (self.modules, self.optimizers, self.schedulers, self.scalers))

    def add(self, obj) -> None:
        if isinstance(obj, random.SystemRandom):
            raise TypeError("a random.SystemRandom draws from the operating system: it has no state to keep; "
                            "attach a seeded random.Random instead")
        if isinstance(obj, nn.Module):
            target = self.modules
        elif isinstance(obj, torch.optim.Optimizer):
            target = self.optimizers
        elif _is_scaler(obj):
            target = self.scalers
        elif _is_scheduler(obj):
            target = self.schedulers
        elif gens.is_generator(obj):
            target = self.generators
        elif _keeps_its_own_state(obj):
            target = self.schedulers
        else:
            raise TypeError(f"gmux cannot track a {type(obj).__name__}: attach modules, optimizers, LR schedulers "
                            f"(torch's, or any object with state_dict() and load_state_dict()), GradScalers and "
                            f"random generators (torch, NumPy, random.Random); pass tensors as extras= and other "
                            f"values as state=")
        if not any(o is obj for o in target):
            target.append(obj)
            self.added += 1
            if target is self.modules and not self.weak:
                module_attributes.remember(obj)     # (what its attributes hold now: a move carries what changes)
            elif target is self.optimizers and not self.weak:
                optimizer_attributes.remember(obj)

    def set_extras(self, extras: dict) -> None:
        """extras= as the script holds it, by reference (as state= is): an EMA kept as a dict of tensors and updated
        as `ema[k] = d * ema[k] + (1 - d) * p` puts new tensors in it at every step, and a copy of the dict taken at
        attach checkpointed the first ones: a moved run went on from the EMA as it was at attach."""
        self.extras = extras
        self.extras_layout = {k: (v.dtype, tuple(v.shape)) for k, v in extras.items()}

    def live_extras(self, layout: bool = True) -> dict:
        """The extra tensors the script's dict holds now. A new process's attach() is given the dict as the script
        builds it and restores into its tensors, so one changed since in its names, dtypes or shapes is refused here,
        before a checkpoint that no restore could take is written. `layout` False: names only (a suspended job's
        tensors may be emptied in place, their values in host copies; the script cannot have run since)."""
        extras = dict(self.extras)
        if self.extras_layout is None:
            return extras
        for name in {*extras, *self.extras_layout}:
            t, then = extras.get(name), self.extras_layout.get(name)
            now = (t.dtype, tuple(t.shape)) if isinstance(t, torch.Tensor) else None
            if not layout and now is not None and then is not None:
                continue
            if now != then:
                was = f"{then[0]} {list(then[1])}" if then else "not there"
                is_ = "gone" if name not in extras else f"{now[0]} {list(now[1])}" if now else f"a {type(t).__name__}"
                raise StateMismatch(
                    f"extras['{name}'] was {was} at attach and is {is_} now: a new process's attach() is given the "
                    f"dict as the script builds it and could not restore this (suspend and resume still work); keep "
                    f"the names, dtypes and shapes extras= had at attach")
        return extras

    # -- tensors the swap engine moves -----------------------------------------------------------------
    def named_tensors(self) -> list[tuple[str, torch.Tensor]]:
        """Every tracked tensor with a name a person can read, each once."""
        return self._walk(named=True)

    def tensors(self) -> list[torch.Tensor]:
        """named_tensors' tensors in its order, without making the names (every suspend walks them)."""
        return self._walk(named=False)

    def _walk(self, named: bool) -> list:
        seen: set[int] = set()
        out: list = []

        def visit(name, t):
            if isinstance(t, torch.Tensor) and id(t) not in seen:
                seen.add(id(t))
                out.append((name, t) if named else t)

        for i, m in enumerate(self.modules):
            prefix = f"module{i}" if len(self.modules) > 1 else "model"
            for n, p in m.named_parameters(remove_duplicate=True):
                visit(named and f"{prefix}.{n}", p)
                if p.grad is not None:
                    visit(named and f"{prefix}.{n}.grad", p.grad)
            for n, b in m.named_buffers(remove_duplicate=True):
                visit(named and f"{prefix}.{n}", b)
            for n, t in metric_states.tensors(m):
                visit(named and f"{prefix}.{n}", t)
        for i, opt in enumerate(o for top in self.optimizers for o in (top, *wrapped(top))):
            names = {id(p): f"optimizer{i}.param{j}" for j, p in
                     enumerate(p for g in opt.param_groups for p in g["params"])} if named else {}
            # Parameters outside every module too (a learned temperature, a flat buffer the model's parameters
            # are views of): their memory is the job's, and the views must move with them.
            for g in opt.param_groups:
                for p in g["params"]:
                    visit(named and names.get(id(p), "param"), p)
            for p, st in opt.state.items():
                if p.grad is not None:
                    visit(named and f"{names.get(id(p), 'param')}.grad", p.grad)
                for k, v in st.items():
                    visit(named and f"{names.get(id(p), 'param')}.{k}", v)
        for k, v in self.extras.items():
            visit(named and f"extras.{k}", v)
        return out

    # -- capture and apply (checkpoint) -------------------------------------------------------------------
    def capture(self, suspended: bool = False) -> dict:
        """The job as nested plain values and tensors, referring to live tensors (nothing is copied here)."""
        self._check_parameters_held()
        grads = []
        for m in self.modules:
            grads.append({n: p.grad for n, p in m.named_parameters() if p.grad is not None})
        return {
            "modules": [m.state_dict(keep_vars=True) for m in self.modules],
            "buffers": [dict(transient_buffers(m)) for m in self.modules],
            "metrics": [metric_states.capture(m) for m in self.modules],
            "attributes": [module_attributes.capture(m) for m in self.modules],
            # (frozen or unfrozen by the script since it built them: an `if epoch == 5` unfreezing is not run again)
            "frozen": [[n for n, p in m.named_parameters() if not p.requires_grad] for m in self.modules],
            # (and the submodules in eval mode: BatchNorm frozen or dropout turned off at `if step == N`, not run
            # again, which a new process built in training mode)
            "eval": [[n for n, sub in m.named_modules() if not sub.training] for m in self.modules],
            "grads": grads,
            "optimizers": [optimizer_state(o) for o in self.optimizers],
            "optimizer_attributes": [optimizer_attributes.capture(o) for o in self.optimizers],
            "schedulers": [s.state_dict() for s in self.schedulers],
            "scalers": [s.state_dict() for s in self.scalers],
            "extras": self.live_extras(layout=not suspended),
            "state": {k: state_deques.stored(v) for k, v in self.state.items()},
            **self.streams(),
        }

    def plain_state(self, tensors: bool = False) -> dict:
        """state='s values that hold no tensor, copied (gmux.job.data keeps them at an epoch's start; a tensor
        keeps the checkpoint's value throughout, as does one deepcopy() refuses). Nothing raises: job.epochs calls it
        at every epoch's top, and a lock or an iterator kept in state= (which a checkpoint refuses by name, as a
        move asks) raised a TypeError into the training loop at the first epoch. `tensors`: those holding tensors
        too (the checkpoint's values, which the body of a restored epoch gets back: a tensor the epoch's top sets
        anew, a running loss or an RNN's hidden state, was left at the top's value)."""
        out = {}
        for k, v in self.state.items():
            try:
                if tensors or not tensors_inside(v):
                    out[k] = copy.deepcopy(v)
            except Exception:
                pass
        return out

    def put_state(self, values: dict) -> None:
        """`values` (a copy: they are kept) into state='s own lists and dicts, for the keys state= has."""
        for k, v in values.items():
            if k in self.state:
                self.state[k] = _refill(self.state[k], copy.deepcopy(v))

    def streams(self) -> dict:
        """The process's random streams and the script's own generators, as a checkpoint holds them."""
        return {"rng": capture_rng(), "generators": [gens.capture(g) for g in self.generators]}

    def set_streams(self, saved: dict) -> None:
        """Only for states restore_check.Fit has passed."""
        restore_rng(saved["rng"])
        for g, state in zip(self.generators, saved.get("generators", [])):
            gens.apply(g, state)

    def _check_parameters_held(self) -> None:
        """Every parameter an optimizer steps must be in a checkpoint: in an attached module or in extras=. One
        that is in neither (a loose learned temperature) would come back in a new process at its initial value,
        its optimizer state restored around it, and the run would silently go another way."""
        # By memory, not identity: a flat parameter the model's parameters are views of is held through them
        # (load_state_dict copies into the views), as is a tensor in extras= over a parameter's memory.
        tensors = [t for m in self.modules for t in (*m.parameters(), *m.buffers())]
        for v in self.extras.values():
            tensors += [*v.parameters(), *v.buffers()] if isinstance(v, nn.Module) else [v]
        held = set().union(*(sparse_tensors.memory(t) for t in tensors if isinstance(t, torch.Tensor)))
        for i, opt in enumerate(self.optimizers):
            for j, p in enumerate(p for g in opt.param_groups for p in g["params"]):
                if not sparse_tensors.memory(p) <= held:
                    raise StateMismatch(f"optimizer {i}'s parameter {j} (shape {tuple(p.shape)}) is in no attached "
                                        f"module: attach the module that holds it, or pass it in extras=, or a "
                                        f"restore would give it back at its initial value")

    def apply(self, snap: dict) -> None:
        """Puts a captured job back in place (same tensor objects). Only for a snapshot that
        gmux.job.restore_check.Fit has passed (layout and values): then nothing here can fail half-way."""
        with torch.no_grad():
            for m, sd, grads in zip(self.modules, snap["modules"], snap["grads"]):
                m.load_state_dict(sd, strict=True)
                for name, p in m.named_parameters():
                    g = grads.get(name)
                    if g is None:
                        p.grad = None
                    elif p.grad is not None and p.grad.shape == g.shape and p.grad.layout == g.layout == torch.strided:
                        p.grad.copy_(g)
                    else:      # (a restored snapshot's tensors are buffers of its own: taken, not copied; a sparse
                        # one always, whose entries are its own and which copy_ refuses between layouts)
                        p.grad = g.to(device=p.device, dtype=p.dtype)
            for opt, sd in zip(self.optimizers, snap["optimizers"]):
                load_optimizer(opt, sd)
            for opt, saved in zip(self.optimizers, snap.get("optimizer_attributes") or []):
                optimizer_attributes.apply(opt, saved)
            for s, sd in zip(self.schedulers, snap["schedulers"]):
                s.load_state_dict(sd)
            for s, sd in zip(self.scalers, snap["scalers"]):
                s.load_state_dict(sd)
            for m, frozen in zip(self.modules, snap.get("frozen", [])):
                for name, p in m.named_parameters():
                    p.requires_grad_(name not in frozen)
            for m, names in zip(self.modules, snap.get("eval", [])):
                for name, sub in m.named_modules():
                    sub.training = name not in names     # (each one's own: train() goes on into its children)
            for m, saved in zip(self.modules, snap.get("buffers", [])):
                live = dict(transient_buffers(m))
                for name, t in saved.items():
                    live[name].copy_(t)
            for m, saved in zip(self.modules, snap.get("metrics", [])):
                metric_states.apply(m, saved)
            for m, saved in zip(self.modules, snap.get("attributes", [])):
                module_attributes.apply(m, saved)
            for name, t in self.extras.items():
                t.copy_(snap["extras"][name])
        restored = {k: _refill(self.state.get(k), state_deques.loaded(v)) for k, v in snap["state"].items()}
        self.state.clear()
        self.state.update(restored)
        self.set_streams(snap)


# -- optimizers that wrap another ------------------------------------------------------------------------
WRAPPED = "__gmux_wrapped__"


def wrapped(opt) -> list:
    """The optimizers `opt` holds whose state its state_dict() leaves out: one that keeps torch's state_dict()
    packs only its own `state`, and SAM's base optimizer (its momentum, its Adam moments) is in another. One that
    defines its own state_dict() (timm's Lookahead, accelerate's) is trusted to hold what it wraps."""
    if type(opt).state_dict is not torch.optim.Optimizer.state_dict:
        return []
    found: list = []
    for value in vars(opt).values():
        for inner in (value if isinstance(value, (list, tuple)) else [value]):
            if isinstance(inner, torch.optim.Optimizer) and inner is not opt and inner.state is not opt.state \
                    and not any(inner is f for f in found):
                found.append(inner)
    return found


def optimizer_state(opt) -> dict:
    sd = {**opt.state_dict(), "__gmux_type__": type(opt).__name__}
    inner = wrapped(opt)
    if inner:
        sd[WRAPPED] = [optimizer_state(o) for o in inner]
    return sd


def load_optimizer(opt, sd: dict) -> None:
    """Loads `opt` and the optimizers it wraps, which keep sharing the parameter groups they shared (SAM's base
    steps with the groups its scheduler sets: each load_state_dict() makes new ones)."""
    inner = wrapped(opt)
    groups = {id(o): o.param_groups for o in (opt, *inner)}
    opt.load_state_dict({k: v for k, v in sd.items() if k not in ("__gmux_type__", WRAPPED)})
    if not inner:
        return
    for o, saved in zip(inner, sd[WRAPPED]):
        load_optimizer(o, saved)
    for o in (opt, *inner):
        before, loaded = groups[id(o)], o.param_groups
        if loaded is not before:
            for g, new in zip(before, loaded):
                g.update(new)
            o.param_groups = before


def transient_buffers(module: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """The buffers registered with persistent=False, by their dotted names: not in state_dict(), yet a model may
    change them in training (running statistics of its own, a step counter), and a new process would start them
    from their initial values."""
    for prefix, sub in module.named_modules():
        for name in sub._non_persistent_buffers_set:
            t = sub._buffers.get(name)
            if t is not None:
                yield f"{prefix}.{name}" if prefix else name, t


def tensors_inside(value, depth: int = 0) -> list:
    """The tensors in a state= value, in its lists, tuples, dicts and deques (as deep as a checkpoint keeps them)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if depth > 8 or not isinstance(value, (list, tuple, dict, collections.deque)):
        return []
    return [t for v in (value.values() if isinstance(value, dict) else value) for t in tensors_inside(v, depth + 1)]


def _refill(live, saved):
    """The restored value, put into the list, dict or deque (of its maxlen) the script holds (inside them too), so
    that a script that kept one (`losses = []; attach(state={"losses": losses})`) goes on with the restored values,
    not the ones it had at its start. Anything else (numbers, strings, tuples, tensors) comes back as the restored
    object."""
    if type(live) is list and type(saved) is list:
        live[:] = [_refill(a, b) for a, b in zip(live, saved)] + saved[len(live):]
    elif type(live) is dict and type(saved) is dict:
        values = {k: _refill(live.get(k), v) for k, v in saved.items()}
        live.clear()
        live.update(values)
    elif type(live) is collections.deque and type(saved) is collections.deque and live.maxlen == saved.maxlen:
        live.clear()       # (a replay buffer the script holds as `buffer = job.state["buffer"]`)
        live.extend(saved)
    else:
        return saved
    return live


# -- random streams ---------------------------------------------------------------------------------------
def capture_rng() -> dict:
    rng = {
        "python": random.getstate(),
        "numpy": gens.legacy_words(np.random.get_state()),
        "torch": torch.get_rng_state(),
        "cuda": [],
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        rng["cuda"] = torch.cuda.get_rng_state_all()
    return rng


def restore_rng(rng: dict) -> None:
    random.setstate(rng["python"])
    np.random.set_state(gens.legacy_state(rng["numpy"]))
    torch.set_rng_state(rng["torch"])
    if rng["cuda"] and torch.cuda.is_available():
        states = list(rng["cuda"])[: torch.cuda.device_count()]
        torch.cuda.set_rng_state_all(states)
