"""The script's own variables that its loops carry from one step to the next (`hidden = model(x, hidden)`,
`step += 1`, `buffer.append(t)`, `warmup.step()`): a new process runs the script from its start to its
loop, so they begin again as the lines before the loop set them. gmux sees the objects it was given, not these;
they can be found in the script's source, in the loops around the line that reads job.data, in each frame of the
script's from there up to the one that attached the job: a name the loop's body assigns and reads before it does,
or changes in place (`.append`, `.update`, an in-place tensor method, an item assigned) without assigning it. A
value that is the job's (state='s, an attached object) is carried and not named. A move's answer names the rest,
as a warning: a running sum for a log does no harm there, a hidden state or a count the schedule reads does.
"""
from __future__ import annotations

import ast
import os
import sysconfig
from types import FrameType, ModuleType
from typing import Iterator, Optional

from gmux.util.text import printable

from .own_loops import script_frames, source

# (and `step`: a warmup or schedule of the script's own, an environment; the job's own are known by identity)
MUTATORS = {"append", "appendleft", "extend", "extendleft", "insert", "add", "update", "pop", "popleft", "clear",
            "remove", "discard", "setdefault", "sort", "reverse", "rotate", "step"}
_LIBRARIES = tuple(p for p in {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["stdlib"]} if p)
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)
_carried: dict = {}     # (file, line, loops from line) -> [(name, line)] the loops around it carry
SHOWN = 5
_UNCHANGEABLE = (type(None), bool, int, float, complex, str, bytes)


def warning(job, frame: Optional[FrameType]) -> Optional[str]:
    """What a new process would begin again of the loops around `frame` (the boundary's), or None."""
    try:
        found = list(_found(job, frame))
    except Exception:           # (a warning's guess: whatever the source holds, the move is not stopped by it)
        return None
    if not found:
        return None
    names = ", ".join(f"`{printable(n, limit=40)}` ({printable(where, limit=80)})" for n, where in found[:SHOWN])
    more = f" and {len(found) - SHOWN} more" if len(found) > SHOWN else ""
    return (f"the script's loops carry {names}{more} from one step to the next in variables of their own, which the "
            f"new process sets again as the script does before its loop: keep in state= what the training reads")


def _found(job, frame: Optional[FrameType]) -> Iterator[tuple[str, str]]:
    ours = _ours(job)
    # (a library's loop, a framework's, is passed over: its Trainer carries its own counters)
    for f, after in script_frames(frame, job.position.attached_at, _LIBRARIES):
        path, values = f.f_code.co_filename, f.f_locals
        for name, line, in_place in _names(path, f.f_lineno or 0, after, f.f_globals):
            # (one only changed in place that holds None or a number carries nothing: an optional scheduler
            # `if sched is not None: sched.step()` left None was named at every move)
            if name in values and id(values[name]) not in ours and not isinstance(values[name], ModuleType) and \
                    not (in_place and isinstance(values[name], _UNCHANGEABLE)):
                yield name, f"{os.path.basename(path)}:{line}"


def _ours(job) -> set:
    tracked = job.tracked
    kept = [job, tracked.state, *tracked.state.values(), *tracked.modules, *tracked.optimizers, *tracked.schedulers,
            *tracked.scalers, *tracked.extras.values(), tracked.extras]
    return {id(v) for v in kept}


def _names(path: str, line: int, after: int, module_globals) -> list:
    """[(name, line, changed in place only)] the loops around `line` that begin after `after` carry, outermost
    first (kept per key)."""
    key = (path, line, after)
    if key not in _carried:
        _, tree = source(path, module_globals)
        loops = [] if tree is None else [n for n in ast.walk(tree) if isinstance(n, (ast.For, ast.AsyncFor, ast.While))
                                         and after < n.lineno <= line <= n.end_lineno]
        names: dict = {}
        for loop in loops:
            names.update((n, (at, in_place)) for n, at, in_place in _carried_by(loop) if n not in names)
        _carried[key] = [(n, at, in_place) for n, (at, in_place) in names.items()]
    return _carried[key]


def _carried_by(loop) -> list:
    """[(name, line, changed in place only)] the loop carries: assigned in its body and read there first, or
    changed in place and never assigned there."""
    events = Events()
    for statement in loop.body:
        events.visit(statement)
    own = set(events.targets(loop.target)) if isinstance(loop, (ast.For, ast.AsyncFor)) else set()
    first, assigned, changed = {}, set(), {}
    for kind, name, line in events.seen:
        first.setdefault(name, (kind, line))
        if kind in ("store", "augment"):
            assigned.add(name)
        elif kind == "change":
            changed.setdefault(name, line)
    carried = [(n, line, False) for n, (kind, line) in first.items()
               if n in assigned and kind in ("load", "augment", "change") and n not in own]
    carried += [(n, line, True) for n, line in changed.items() if n not in assigned and n not in own]
    return sorted(carried, key=lambda c: c[1])


class Events(ast.NodeVisitor):
    """The body's uses of names in the order they run: ("load" | "store" | "augment" | "change", name, line)."""

    def __init__(self):
        self.seen: list = []

    def targets(self, node) -> Iterator[str]:
        for n in ast.walk(node):
            if isinstance(n, ast.Name):
                yield n.id

    def visit_Name(self, node):
        self.seen.append(("store" if isinstance(node.ctx, ast.Store) else "load", node.id, node.lineno))

    def visit_Assign(self, node):
        self.visit(node.value)
        for target in node.targets:
            self.visit(target)

    def visit_AnnAssign(self, node):
        if node.value is not None:
            self.visit(node.value)
        self.visit(node.target)

    def visit_AugAssign(self, node):
        self.visit(node.value)
        if isinstance(node.target, ast.Name):
            self.seen.append(("augment", node.target.id, node.lineno))
        else:
            self.visit(node.target)

    def visit_NamedExpr(self, node):
        self.visit(node.value)
        self.visit(node.target)

    def visit_Subscript(self, node):
        if isinstance(node.ctx, (ast.Store, ast.Del)) and isinstance(node.value, ast.Name):
            self.visit(node.slice)
            self.seen.append(("change", node.value.id, node.lineno))
        else:
            self.generic_visit(node)

    def visit_Call(self, node):
        func = node.func
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and \
                (func.attr in MUTATORS or (func.attr.endswith("_") and not func.attr.startswith("_"))):
            for arg in [*node.args, *(k.value for k in node.keywords)]:
                self.visit(arg)
            self.seen.append(("change", func.value.id, node.lineno))
        else:
            self.generic_visit(node)

    def visit_For(self, node):
        self.visit(node.iter)
        self.visit(node.target)
        for statement in node.body + node.orelse:
            self.visit(statement)

    visit_AsyncFor = visit_For

    def visit_ListComp(self, node):
        """Its targets are its own: only the names it reads from the loop's scope count."""
        inner = Events()
        for generator in node.generators:
            inner.visit(generator.iter)
            for condition in generator.ifs:
                inner.visit(condition)
        for part in (node.key, node.value) if isinstance(node, ast.DictComp) else (node.elt,):
            inner.visit(part)
        own = {n for g in node.generators for n in self.targets(g.target)}
        self.seen += [e for e in inner.seen if e[1] not in own and e[0] == "load"]

    visit_SetComp = visit_GeneratorExp = visit_DictComp = visit_ListComp

    def generic_visit(self, node):
        if isinstance(node, _SCOPES):
            return
        super().generic_visit(node)

