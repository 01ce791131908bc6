"""Does a checkpoint fit this job? Decided against the live job before the job changes, in two passes.

`Fit.layout(skeleton, table)` runs once the metadata is decoded, before any buffer is allocated for the data
(gmux.job.checkpoint.read calls it): every section has the type, keys and length the job has; every tensor has the
dtype and shape of the live tensor it will be copied into (its device is that tensor's: the file holds host bytes);
optimizer state per parameter has the keys, shapes and dtypes the optimizer uses, and its parameter groups the job's
count, sizes and value types; LR scheduler and AMP scaler states (and torchmetrics', and the plain attributes of the
script's modules) are shaped like the job's; the step count and the data position are non-negative integers; the
Python random state is tried on a scratch generator. It returns the bytes of tensor data it vouched for (the rest,
tensors inside state=, are bounded by the file's length).

`Fit.values(snap)` runs once the data is read and checksummed, still before anything is applied: the torch,
CUDA and NumPy random states (and the data position's) are tried on scratch generators, and the plain attributes
of the script's modules and optimizers checked with their data (a NumPy value's dtype and shape), so that applying
them cannot fail half-way. Every refusal is a CheckpointError naming the file and the field (StateMismatch, a
CheckpointError, where the checkpoint is sound but was taken from another model or optimizer).
"""
from __future__ import annotations

import math
import random
from typing import Optional

import numpy as np
import torch

from . import generators as gens, metric_states, module_attributes, optimizer_attributes, sparse_tensors
from .optimizer_states import PARAM, fresh_state
from .checkpoint import DTYPES, CheckpointError, Row, TensorRef
from .data import generator_states
from .state import WRAPPED, StateMismatch, wrapped

SECTIONS = ("modules", "buffers", "grads", "optimizers", "schedulers", "scalers", "extras", "state", "rng",
            "position", "steps", "generators", "frozen", "eval", "metrics", "attributes", "optimizer_attributes")
# (absent from checkpoints written before they existed)
OPTIONAL = ("generators", "buffers", "frozen", "eval", "metrics", "attributes", "optimizer_attributes")


def describe(v) -> str:
    if isinstance(v, (TensorRef, torch.Tensor, sparse_tensors.SparseRef)):
        return "a sparse tensor" if isinstance(v, sparse_tensors.SparseRef) else "a tensor"
    if v is None:
        return "None"
    name = type(v).__name__
    return f"{'an' if name[0] in 'aeiou' else 'a'} {name}"


def _dtype(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


class Fit:
    def __init__(self, job, origin: str):
        self.job, self.origin = job, origin
        self.live = job.snapshot()           # the job's state dicts, referring to its tensors (nothing copied)
        self.table: list[Row] = []
        self.vouched = 0
        # table row -> the job's own host tensor it restores, contiguous and not shared: a fresh process's
        # restore may read its bytes straight into it (Job.restore, fresh)
        self.into: dict[int, torch.Tensor] = {}
        self._filled: set = set()

    def fail(self, problem: str, error=CheckpointError):
        raise error(self.origin, problem)

    # -- generic shapes ---------------------------------------------------------------------------------
    def row(self, saved, where: str) -> Row:
        if not isinstance(saved, TensorRef):
            self.fail(f"{where}: {describe(saved)}, the job has a tensor")
        return self.table[saved.index]

    def tensor(self, saved, dtype: str, shape: tuple, where: str, sparse: bool = False) -> None:
        if sparse and isinstance(saved, sparse_tensors.SparseRef):     # (a gradient, or state made like one)
            self.vouched += sparse_tensors.fits(saved, self.table, dtype, shape, self.origin, where)
            return
        row = self.row(saved, where)
        if row.dtype != dtype:
            self.fail(f"{where}: dtype {row.dtype}, the job has {dtype}")
        if row.shape != tuple(shape):
            self.fail(f"{where}: shape {row.shape}, the job has {tuple(shape)}")
        self.vouched += row.nbytes

    def keys(self, saved: dict, live: dict, where: str) -> None:
        missing = [k for k in live if k not in saved]
        extra = [k for k in saved if k not in live]
        if missing or extra:
            self.fail(f"{where}: keys {sorted(map(str, saved))}, the job has {sorted(map(str, live))}")

    def alike(self, saved, live, where: str, sparse: bool = False) -> None:
        """`saved` has the structure of the job's `live` value: same container types, keys and lengths, the
        same kind of leaf (numbers int and float alike, bool apart), tensors of the same dtype and shape."""
        if isinstance(live, torch.Tensor):
            self.tensor(saved, _dtype(live), tuple(live.shape), where, sparse)
        elif isinstance(live, dict):
            if not isinstance(saved, dict):
                self.fail(f"{where}: {describe(saved)}, the job has a dict")
            self.keys(saved, live, where)
            for k, v in live.items():
                self.alike(saved[k], v, f"{where} '{k}'")
        elif isinstance(live, (list, tuple)):
            if type(saved) is not type(live):
                self.fail(f"{where}: {describe(saved)}, the job has {describe(live)}")
            if len(saved) != len(live):
                self.fail(f"{where}: {len(saved)} items, the job has {len(live)}")
            for i, (s, v) in enumerate(zip(saved, live)):
                self.alike(s, v, f"{where}[{i}]")
        elif type(live) in (int, float):
            if type(saved) not in (int, float):
                self.fail(f"{where}: {describe(saved)}, the job has {describe(live)}")
        elif type(saved) is not type(live):
            self.fail(f"{where}: {describe(saved)}, the job has {describe(live)}")

    def _may_fill(self, index: int, t: torch.Tensor) -> None:
        storage = t.untyped_storage().data_ptr() if t.device.type == "cpu" and t.is_contiguous() else None
        if storage is not None and storage not in self._filled:      # (tied weights: one of them)
            self._filled.add(storage)
            self.into[index] = t.detach()

    def counter(self, saved, where: str) -> None:
        if type(saved) is not int:
            self.fail(f"{where}: {describe(saved)}, the job has an int")
        if saved < 0:
            self.fail(f"{where}: {saved}, which is negative")

    # -- pass 1: before the data ------------------------------------------------------------------------
    def layout(self, skel, table: list) -> int:
        self.table, self.vouched = table, 0
        if not isinstance(skel, dict):
            self.fail(f"the skeleton is {describe(skel)}, not a dict of sections")
        for key in skel:
            if key not in SECTIONS:
                self.fail(f"corrupt: unexpected section {str(key)[:40]!r}")
        for key in SECTIONS:
            if key not in skel and key not in OPTIONAL:
                self.fail(f"corrupt: no '{key}' section")
        for key in ("modules", "grads", "optimizers", "schedulers", "scalers"):
            if not isinstance(skel[key], list):
                self.fail(f"'{key}': {describe(skel[key])}, the job has a list")
        for key in ("modules", "optimizers", "schedulers", "scalers"):
            have, got = len(self.live[key]), len(skel[key])
            if have != got:
                self.fail(f"the checkpoint holds {got} {key} but this job attached {have}", StateMismatch)
        if len(skel["grads"]) != len(skel["modules"]):
            self.fail(f"'grads': {len(skel['grads'])} items, the job has {len(skel['modules'])}")
        self.modules(skel["modules"], skel["grads"])
        modules = self.job.tracked.modules
        for key, check in (("buffers", self.buffers), ("frozen", self.frozen), ("eval", self.eval_modes),
                           ("metrics", lambda saved: metric_states.check(self, saved, modules, StateMismatch)),
                           ("attributes", lambda saved: module_attributes.check(self, saved, modules))):
            if key in skel:
                check(skel[key])
        for i, (sd, opt) in enumerate(zip(skel["optimizers"], self.job.tracked.optimizers)):
            self.optimizer(i, sd, opt, self.live["optimizers"][i])
        for kind, name in (("schedulers", "scheduler"), ("scalers", "scaler")):
            for i, (sd, live) in enumerate(zip(skel[kind], self.live[kind])):
                self.alike(sd, live, f"{name} {i}")
        for i, sd in enumerate(skel["scalers"]):
            self.scaler(i, sd)
        self.extras(skel["extras"])
        if not isinstance(skel["state"], dict):
            self.fail(f"'state': {describe(skel['state'])}, the job has a dict")
        self.rng(skel["rng"])
        self.generators(skel.get("generators", []))
        self.position(skel["position"])
        self.counter(skel["steps"], "'steps'")
        return self.vouched

    def modules(self, modules: list, grads: list) -> None:
        for i, (sd, live, module) in enumerate(zip(modules, self.live["modules"], self.job.tracked.modules)):
            if not isinstance(sd, dict):
                self.fail(f"module {i}: {describe(sd)}, the job has a dict")
            missing = sorted(set(live) - set(sd))
            extra = sorted(map(str, set(sd) - set(live)))
            if missing or extra:
                self.fail(f"it was taken from a different model: missing {missing[:5]}, unexpected {extra[:5]} "
                          f"(module {i})", StateMismatch)
            for name, t in live.items():
                if not isinstance(t, torch.Tensor):
                    metric_states.alike(self, module, name, sd[name], t, f"module {i} '{name}'")
                    continue
                if t.layout == torch.sparse_coo or isinstance(sd[name], sparse_tensors.SparseRef):
                    self.sparse_buffer(sd[name], t, f"parameter or buffer '{name}'")
                    continue
                row = self.row(sd[name], f"parameter or buffer '{name}'")
                if row.shape != tuple(t.shape) or row.dtype != _dtype(t):
                    self.fail(f"it was taken from a different model: parameter or buffer '{name}' is {row.shape} "
                              f"{row.dtype} in the checkpoint but {tuple(t.shape)} {_dtype(t)} in this job",
                              StateMismatch)
                self.vouched += row.nbytes
                self._may_fill(sd[name].index, t)
            if not isinstance(grads[i], dict):
                self.fail(f"'grads'[{i}]: {describe(grads[i])}, the job has a dict")
            params = dict(module.named_parameters())
            for name, g in grads[i].items():
                if name not in params:
                    self.fail(f"gradient of unknown parameter {str(name)[:80]!r}", StateMismatch)
                p = params[name]
                self.tensor(g, _dtype(p), tuple(p.shape), f"gradient of '{name}'", sparse=True)

    def sparse_buffer(self, saved, t: torch.Tensor, where: str) -> None:
        """A sparse COO buffer (a graph's adjacency) is held as one (its copy_ takes the saved one's entries)."""
        if (t.layout == torch.sparse_coo) != isinstance(saved, sparse_tensors.SparseRef):
            self.fail(f"it was taken from a different model: {where} is {'' if t.is_sparse else 'not '}sparse in "
                      f"this job, {describe(saved)} in the checkpoint", StateMismatch)
        self.vouched += sparse_tensors.fits(saved, self.table, _dtype(t), tuple(t.shape), self.origin, where)

    def optimizer(self, i: int, sd, opt: torch.optim.Optimizer, live: dict) -> None:
        where = f"optimizer {i}"
        if not isinstance(sd, dict):
            self.fail(f"{where}: {describe(sd)}, the job has a dict")
        self.keys(sd, live, where)
        kind = sd["__gmux_type__"]
        if not isinstance(kind, str):
            self.fail(f"{where} '__gmux_type__': {describe(kind)}, the job has a str")
        if kind != type(opt).__name__:
            self.fail(f"{where} is {kind[:80]} in the checkpoint but {type(opt).__name__} in this job", StateMismatch)
        groups = sd["param_groups"]
        if not isinstance(groups, list) or not all(isinstance(g, dict) for g in groups):
            self.fail(f"{where} 'param_groups': {describe(groups)}, the job has a list of dicts")
        for g in groups:
            if not isinstance(g.get("params"), list) or not all(type(p) is int for p in g["params"]):
                self.fail(f"{where} 'param_groups': 'params' is not a list of parameter numbers")
        mine = [len(g["params"]) for g in live["param_groups"]]
        got = [len(g["params"]) for g in groups]
        if mine != got:
            self.fail(f"{where} has parameter groups of sizes {got} in the checkpoint but {mine} in this job",
                      StateMismatch)
        for j, (g, lg) in enumerate(zip(groups, live["param_groups"])):
            self.alike({k: v for k, v in g.items() if k != "params"},
                       {k: v for k, v in lg.items() if k != "params"}, f"{where} param group {j}")
            # What torch refuses when an optimizer is made, it takes unchecked from a state dict, and trains on.
            for k, v in g.items():
                if type(v) is float and (math.isnan(v) or (k == "lr" and v < 0)) and v != lg.get(k):
                    self.fail(f"{where} param group {j} {k!r}: {v}, which no optimizer takes")
        # torch maps the saved parameter numbers to the job's parameters by position, group by group.
        saved_ids = [p for g in groups for p in g["params"]]
        if len(set(saved_ids)) != len(saved_ids):
            self.fail(f"{where} 'param_groups': a parameter number appears twice")
        position = {pid: n for n, pid in enumerate(saved_ids)}
        params = [(p, g) for g in opt.param_groups for p in g["params"]]
        state = sd["state"]
        if not isinstance(state, dict):
            self.fail(f"{where} 'state': {describe(state)}, the job has a dict")
        for pid, st in state.items():
            if type(pid) is not int or pid not in position:
                self.fail(f"{where} 'state': state for {str(pid)[:40]!r}, which is none of its parameters")
            n = position[pid]
            self.param_state(f"{where} state for param {n}", st, params[n], live["state"].get(n), opt)
        inner, mine = sd.get(WRAPPED, []), live.get(WRAPPED, [])     # (SAM's base: state.wrapped)
        if not isinstance(inner, list) or len(inner) != len(mine):
            self.fail(f"{where} '{WRAPPED}': {describe(inner)}, the job has a list of {len(mine)}")
        for j, (saved, held, live_sd) in enumerate(zip(inner, wrapped(opt), mine)):
            self.optimizer(f"{i}'s wrapped {j}", saved, held, live_sd)

    def param_state(self, where: str, saved, param_group, live: Optional[dict], opt) -> None:
        p, group = param_group
        if not isinstance(saved, dict):
            self.fail(f"{where}: {describe(saved)}, the job has a dict")
        expected = fresh_state(opt, group)  # a fresh optimizer: what it would create
        if live and expected is not None:   # the job's optimizer has state for it: exactly that structure
            self.keys(saved, live, where)
            for k, v in live.items():
                self.alike(saved[k], v, f"{where} '{k}'", sparse=expected.get(k) == PARAM)
            return
        if expected is not None:
            self.keys(saved, expected, where)
        for k, v in saved.items():
            if not isinstance(k, str):
                self.fail(f"{where}: key {str(k)[:40]!r} is not a name")
            what = expected[k] if expected is not None else None
            if what is None:
                self.any_state(v, f"{where} '{k}'", opt)
            elif what == PARAM:       # (a sparse one too: SGD's momentum under sparse gradients)
                self.tensor(v, _dtype(p), tuple(p.shape), f"{where} '{k}'", sparse=True)
            elif isinstance(v, TensorRef):
                row = self.table[v.index]
                if row.shape != () or not torch.empty(0, dtype=DTYPES[row.dtype]).is_floating_point():
                    self.fail(f"{where} '{k}': {row.dtype} {row.shape}, the job has a floating-point scalar")
                self.vouched += row.nbytes
            elif type(v) not in (int, float):
                self.fail(f"{where} '{k}': {describe(v)}, the job has a number")

    def any_state(self, v, where: str, opt) -> None:
        """An optimizer not known here keeps what it likes: tensors of any shape (Adafactor's factored row and
        column statistics, LBFGS's flat history), numbers, None and lists of those (LBFGS's past directions),
        also where the job's optimizer already has state (LBFGS's changes shape from step to step). Each
        tensor vouches for no more bytes than all the optimizer's parameters hold, so a forged row stays bounded."""
        cap = sum(p.numel() * p.element_size() for g in opt.param_groups for p in g["params"])
        for item in (v if isinstance(v, list) else [v]):
            if isinstance(item, (TensorRef, sparse_tensors.SparseRef)):
                self.vouched += min(sparse_tensors.nbytes(item, self.table), cap)
            elif item is not None and type(item) not in (int, float, bool):
                self.fail(f"{where}: {describe(item)}, which is none of a tensor, a number or a list of them")

    def scaler(self, i: int, sd: dict) -> None:
        if "scale" in sd and not (math.isfinite(sd["scale"]) and sd["scale"] > 0):
            self.fail(f"scaler {i} 'scale': {sd['scale']}, which is not a positive finite number")
        if "_growth_tracker" in sd:
            self.counter(sd["_growth_tracker"], f"scaler {i} '_growth_tracker'")

    def buffers(self, buffers) -> None:
        """The modules' persistent=False buffers: the job's names, dtypes and shapes."""
        if not isinstance(buffers, list) or len(buffers) != len(self.live["buffers"]):
            self.fail(f"'buffers': {describe(buffers)}, the job has a list of {len(self.live['buffers'])}")
        for i, (saved, live) in enumerate(zip(buffers, self.live["buffers"])):
            if not isinstance(saved, dict):
                self.fail(f"module {i} buffers: {describe(saved)}, the job has a dict")
            if set(saved) != set(live):
                self.fail(f"module {i} buffers not in state_dict: {sorted(map(str, saved))[:8]}, the job has "
                          f"{sorted(live)[:8]}", StateMismatch)
            for name, t in live.items():
                self.tensor(saved[name], _dtype(t), tuple(t.shape), f"module {i} buffer '{name}'")

    def frozen(self, frozen) -> None:
        """The names of the module's parameters that did not require gradients (each integer one among them)."""
        if not isinstance(frozen, list) or len(frozen) != len(self.live["frozen"]):
            self.fail(f"'frozen': {describe(frozen)}, the job has a list of {len(self.live['frozen'])}")
        for i, (names, module) in enumerate(zip(frozen, self.job.tracked.modules)):
            known = dict(module.named_parameters())
            if not isinstance(names, list) or not all(isinstance(n, str) and n in known for n in names) or any(
                    n not in names and not (p.is_floating_point() or p.is_complex()) for n, p in known.items()):
                self.fail(f"module {i} frozen parameters: {str(names)[:80]}, not a list of its parameters' names "
                          f"holding each that cannot require gradients", StateMismatch)

    def eval_modes(self, saved) -> None:
        """The names of the module's submodules that were in eval mode."""
        if not isinstance(saved, list) or len(saved) != len(self.live["eval"]):
            self.fail(f"'eval': {describe(saved)}, the job has a list of {len(self.live['eval'])}")
        for i, (names, module) in enumerate(zip(saved, self.job.tracked.modules)):
            known = dict(module.named_modules())
            if not isinstance(names, list) or not all(isinstance(n, str) and n in known for n in names):
                self.fail(f"module {i} submodules in eval mode: {str(names)[:80]}, not a list of its submodules' "
                          f"names", StateMismatch)

    def extras(self, extras) -> None:
        if not isinstance(extras, dict):
            self.fail(f"'extras': {describe(extras)}, the job has a dict")
        for name in extras:
            if name not in self.live["extras"]:
                self.fail(f"extra tensor {str(name)[:80]!r} is in the checkpoint but not in this job")
        for name, t in self.live["extras"].items():
            if name not in extras:
                self.fail(f"extra tensor '{name}' is not in the checkpoint", StateMismatch)
            self.tensor(extras[name], _dtype(t), tuple(t.shape), f"extra tensor '{name}'")

    def rng(self, rng, where: str = "rng") -> None:
        live = self.live["rng"]
        if not isinstance(rng, dict):
            self.fail(f"'{where}': {describe(rng)}, the job has a dict")
        self.keys(rng, live, f"'{where}'")
        py = rng["python"]
        if not (type(py) is tuple and len(py) == 3 and type(py[1]) is tuple
                and all(type(x) is int for x in py[1]) and type(py[0]) is int and type(py[2]) in (type(None), float)):
            self.fail(f"{where} 'python': not a Python random state (version, 625 integers, gauss)")
        try:
            random.Random().setstate(py)    # a scratch generator: the job's own is untouched
        except (TypeError, ValueError, OverflowError) as e:
            self.fail(f"{where} 'python': {e}")
        np_state = rng["numpy"]
        if not (type(np_state) is tuple and len(np_state) == 5 and np_state[0] == "MT19937"
                and type(np_state[2]) is int and type(np_state[3]) is int and type(np_state[4]) in (int, float)):
            self.fail(f"{where} 'numpy': not a NumPy MT19937 state")
        self.alike(np_state[1], live["numpy"][1], f"{where} 'numpy' keys")
        try:
            gens.mt19937_position(np_state[2])     # (the keys' length: `alike`)
        except ValueError as e:
            self.fail(f"{where} 'numpy': {e}")
        self.alike(rng["torch"], live["torch"], f"{where} 'torch'")
        cuda = rng["cuda"]
        if not isinstance(cuda, list) or len(cuda) > 1024:
            self.fail(f"{where} 'cuda': {describe(cuda)}, the job has a list of device states")
        for k, s in enumerate(cuda):
            row = self.row(s, f"{where} 'cuda'[{k}]")
            if row.dtype != "uint8" or row.shape not in ((16,), (8,)):
                self.fail(f"{where} 'cuda'[{k}]: {row.dtype} {row.shape}, the job has uint8 (16,)")
            self.vouched += row.nbytes

    def generators(self, saved, where: str = "") -> None:
        """The script's own generators: as many, of the same kinds; a state with tensors (torch's, NumPy's
        legacy one) is shaped like the job's here and tried in `values`, the others are tried now."""
        live, objs = self.live["generators"], self.job.tracked.generators
        if not isinstance(saved, list):
            self.fail(f"'{where}generators': {describe(saved)}, the job has a list")
        if len(saved) != len(live):
            self.fail(f"the checkpoint holds {len(saved)} random generators but this job attached {len(live)}",
                      StateMismatch)
        for i, (s, lv, g) in enumerate(zip(saved, live, objs)):
            if not (isinstance(s, dict) and set(s) == {"kind", "state"}) or s["kind"] != lv["kind"]:
                what = s.get("kind") if isinstance(s, dict) else describe(s)
                self.fail(f"{where}generator {i}: {str(what)[:40]}, the job attached a {lv['kind']} generator",
                          StateMismatch)
            if lv["kind"] in ("torch", "numpy_legacy"):
                self.alike(s["state"], lv["state"], f"{where}generator {i}")
            elif problem := gens.problem(s, g):
                self.fail(f"{where}generator {i}: {problem}")

    def position(self, pos) -> None:
        if not isinstance(pos, dict):
            self.fail(f"'position': {describe(pos)}, the job has a dict")
        live = self.job.position.to_dict()
        for key in ("epoch_streams", "data_streams", "beside", "reused_workers", "fetch_streams", "epoch_state",
                    "passes", "own_loop"):
            if key not in pos:      # (written before it existed)
                live.pop(key)
        self.keys(pos, live, "'position'")
        if not isinstance(pos.get("epoch_state") or {}, dict):
            self.fail(f"position 'epoch_state': {describe(pos['epoch_state'])}, the job has a dict")
        for key in ("epoch", "index", "passes"):
            self.counter(pos.get(key, 0), f"position '{key}'")
        if not ((loop := pos.get("own_loop")) is None or isinstance(loop, str) and len(loop) <= 300):
            self.fail(f"position 'own_loop': {f'{len(loop)} characters' if isinstance(loop, str) else describe(loop)}"
                      f", the job has a line of its script (at most 300 characters) or None")
        for key in ("marked_by_script", "reused_workers"):
            if not isinstance(pos.get(key, False), bool):
                self.fail(f"position '{key}': {describe(pos[key])}, the job has a bool")
        rng_shape = tuple(self.live["rng"]["torch"].shape)
        if pos["epoch_rng"] is None:
            if pos["index"] > 0:
                self.fail(f"position 'epoch_rng': None, but the checkpoint is {pos['index']} batches into an "
                          f"epoch and replaying them needs it")
        else:
            self.tensor(pos["epoch_rng"], "uint8", rng_shape, "position 'epoch_rng'")
        for state in generator_states(pos["epoch_generator"]):
            self.generator_row(state, "position 'epoch_generator'", rng_shape)
        for key in ("epoch_streams", "data_streams", "fetch_streams"):
            if pos.get(key) is not None:
                self.streams_layout(pos[key], f"position '{key}'")
        if pos.get("fetch_streams") is not None and pos["index"] < 1:
            self.fail("position 'fetch_streams': the checkpoint says it was taken after a fetch, at no batch")
        beside = pos.get("beside", [])
        if not isinstance(beside, list) or len(beside) > 64:
            self.fail(f"position 'beside': {describe(beside)}, the job has a list of loaders read beside its own")
        for i, reading in enumerate(beside):
            where = f"position 'beside'[{i}]"
            if not (isinstance(reading, dict) and set(reading) == {"index", "streams", "generators"}):
                self.fail(f"{where}: {describe(reading)}, the job has a dict of index, streams and generators")
            self.counter(reading["index"], f"{where} 'index'")
            self.streams_layout(reading["streams"], f"{where} 'streams'")
            if not isinstance(reading["generators"], list) or len(reading["generators"]) > 16:
                self.fail(f"{where} 'generators': {describe(reading['generators'])}, the job has a list of states")
            for state in reading["generators"]:
                self.generator_row(state, f"{where} 'generators'", rng_shape)

    def streams_layout(self, streams, where: str) -> None:
        if not (isinstance(streams, dict) and set(streams) == {"rng", "generators"}):
            self.fail(f"{where}: {describe(streams)}, the job has a dict of rng and generators")
        self.rng(streams["rng"], f"{where} rng")
        self.generators(streams["generators"], f"{where} ")

    def generator_row(self, state, where: str, rng_shape: tuple) -> None:
        """A loader's generator state: a CPU generator's (a DataLoader's and its samplers' are)."""
        row = self.row(state, where)
        if row.dtype != "uint8" or row.shape != rng_shape:
            self.fail(f"{where}: {row.dtype} {row.shape}, the job has a generator state")
        self.vouched += row.nbytes

    # -- pass 2: the data, still before anything is applied -------------------------------------------------
    def values(self, snap: dict) -> None:
        self.streams(snap["rng"], snap.get("generators", []), "")
        self.generator(snap["position"]["epoch_rng"], "position 'epoch_rng'")
        for state in generator_states(snap["position"]["epoch_generator"]):
            self.generator(state, "position 'epoch_generator'")
        pos = snap["position"]
        for key in ("epoch_streams", "data_streams", "fetch_streams"):
            if pos.get(key) is not None:
                self.streams(pos[key]["rng"], pos[key]["generators"], f"position '{key}' ")
        for i, reading in enumerate(pos.get("beside", [])):
            self.streams(reading["streams"]["rng"], reading["streams"]["generators"], f"position 'beside'[{i}] ")
            for state in reading["generators"]:
                self.generator(state, f"position 'beside'[{i}] 'generators'")
        # (pass 1 took a NumPy value's data on trust, a TensorRef: a "scalar" of three values was put back as an
        # array, one of bfloat16 failed with a TypeError once the weights were loaded)
        module_attributes.check(self, snap.get("attributes", [{}] * len(modules := self.job.tracked.modules)), modules)
        optimizer_attributes.check(self, snap.get("optimizer_attributes"), self.job.tracked.optimizers)

    def streams(self, rng: dict, generators: list, where: str) -> None:
        self.generator(rng["torch"], f"{where}rng 'torch'")
        try:
            np.random.RandomState().set_state(gens.legacy_state(rng["numpy"]))
        except (TypeError, ValueError, OverflowError) as e:
            self.fail(f"{where}rng 'numpy': {e}")
        for i, (s, g) in enumerate(zip(generators, self.job.tracked.generators)):
            if problem := gens.problem(s, g):
                self.fail(f"{where}generator {i}: {problem}")
        cuda = rng["cuda"]
        if cuda and torch.cuda.is_available():
            for k, s in enumerate(cuda[: torch.cuda.device_count()]):
                self.generator(s, f"{where}rng 'cuda'[{k}]", device=f"cuda:{k}")

    def generator(self, state: Optional[torch.Tensor], where: str, device: str = "cpu") -> None:
        if state is None:
            return
        try:
            torch.Generator(device=device).set_state(state)   # a scratch generator: torch's own check
        except (RuntimeError, TypeError, ValueError) as e:
            self.fail(f"{where}: {str(e).splitlines()[0]}")

