"""Plain data among an object's attributes (a Trainer callback's, a module's) that changed since the object was
attached, which a move carries to the process it continues the job in: None, booleans, numbers, strings, and lists,
tuples and dicts of them, within bounds; tensors, alone (a running statistic) or inside such a container (a
LightningModule's list of its steps' losses); and NumPy values, deques, dicts of collections' kinds and random
generators (gmux.job.tagged_values). Read back from a checkpoint file, each value is checked against what the new
process's object holds under its name first.

Only what changed since `remember` (at attach, or as a Trainer starts) is carried: an attribute the script set from
its own process (a device name from LOCAL_RANK, a path) stays what the new process sets. And an object is carried
whole or not at all: one whose other attributes changed too (a tensor or an object made again or changed in place:
a cache grown with the count that sized it, a writer made behind an "initialized" flag) keeps what the new process
builds, as before gmux carried any, rather than a count without its cache or a flag without its writer.
"""
from __future__ import annotations

import collections
import functools
import itertools
import types
import weakref

import torch

from . import generators, tagged_values
from .checkpoint import DTYPES, TensorRef

# values in one attribute, nested ones counted: an epoch of 100,000 steps appending (loss, accuracy) to a list
MAX_ITEMS = 1 << 18
MAX_TEXT = 4096         # characters in one string
MAX_DEPTH = 4


def remember(obj) -> None:
    """What `obj`'s attributes hold now, the first time it is seen (an object that takes no weak reference: never
    carried)."""
    try:
        if obj not in _seen:
            _seen[obj] = {name: _look(value) for name, value in vars(obj).items()}
            _takes_then[obj] = {name: _takes(value) for name, value in vars(obj).items()}
    except TypeError:
        pass


def changed(obj, skip=frozenset()) -> dict:
    """{name: value} of `obj`'s attributes (those not in `skip`) that hold plain data and changed since `remember`;
    {} for an object not remembered, or one another attribute of which changed (not plain, or over the bounds)."""
    try:
        then = _seen.get(obj)
    except TypeError:
        return {}
    if then is None:
        return {}
    out = {}
    for name, value in vars(obj).items():
        if not isinstance(name, str) or name in skip or issubclass(type(value), _WIRING) or \
                then.get(name, _NEW) == _look(value):
            continue
        # (each attribute within its own bound: a vocabulary of 50,000 words built in __init__ does not use up
        # what a count after it may take)
        if not _plain(value, [MAX_ITEMS], 0):
            return {}
        try:
            out[name] = tagged_values.encode(value)
        except ValueError:      # (a dict of its own keyed as gmux tags one: named by `unkept_numbers`)
            return {}
    return out


def unkept_numbers(obj, skip=frozenset()) -> str | None:
    """What `obj` holds that changed since `remember` and is numbers a move does not carry: an attribute (not in
    `skip`) holding a set, or a NumPy value of a kind a checkpoint does not hold (or a list, tuple, dict or deque
    with one inside, or a dict keyed by NumPy numbers: `_numbers_in`), as "'name' (a set)"; None if there is none.
    `changed` leaves such an object out whole, and the new process's object would start from its constructor's
    values (a best loss that became a NumPy float took its patience counter with it)."""
    try:
        then = _seen.get(obj)
    except TypeError:
        return None
    if then is None:
        return None
    for name, value in vars(obj).items():
        if isinstance(name, str) and name not in skip and not issubclass(type(value), _WIRING) and \
                then.get(name, _NEW) != _look(value):
            found = _numbers_in(value, [MAX_ITEMS], 0)
            if found is not None:
                return f"{name!r} (a {found})"
            then_kind = then.get(name)
            if tagged_values.own_factory(value) and not (type(then_kind) is tuple and then_kind[0] == "defaultdict"):
                # (its items go into the new object's own defaultdict, which one made since has not: the restore
                # refused what the reports had called movable)
                return f"{name!r} (a defaultdict of the script's own factory, made since it started)"
    return None


def graph_beside(obj, skip=frozenset(), alone: bool = False) -> str | None:
    """An attribute of `obj` (not in `skip`) holding a tensor in the step's graph (an activation kept for a hook or a
    plot), as "'name'", where another attribute holding plain data changed since `remember` too (or, `alone`,
    whether or not); else None. `changed` leaves the object out whole for the graph's tensor, and the other (a count
    of calls the forward reads) would start again."""
    try:
        then = _seen.get(obj)
    except TypeError:
        return None
    graph, other = None, False
    for name, value in (() if then is None else vars(obj).items()):
        if not isinstance(name, str) or name in skip or issubclass(type(value), _WIRING) or \
                then.get(name, _NEW) == _look(value):
            continue
        if type(value) is torch.Tensor and value.requires_grad:
            graph = graph or repr(name)
        else:       # (one `changed` would carry: another object is made again by the new process, as before)
            other = other or _plain(value, [MAX_ITEMS], 0)
    return graph if other or alone else None


HOST = "__gmux_host__"     # beside the attributes carried: those whose tensors the script kept on the host


def not_carried(obj, keys, kind: str, name: str, hint: str = "") -> str | None:
    """Why a move would lose what `obj` (a `kind`, "module" or "optimizer", of the script's own, called `name`)
    counted in its attributes, leaving out `keys`; `hint` follows the first reason (None: it would lose nothing)."""
    who = f"{kind} {name}"
    found = unkept_numbers(obj, keys)
    if found is not None:
        return (f"its {who}'s attribute {found} changed as it trained, and gmux carries only plain data (numbers, "
                f"strings, tensors, NumPy numbers, lists, dicts, deques, str or int keys): a new process would start "
                f"the {kind}'s attributes anew{hint}")
    other = kind_changed(obj, keys)
    if other is not None:
        return (f"its {who}'s attribute {other}: a new process builds the {kind} as the script does, and its "
                f"restore would not put the other kind there (keep one kind in it, or None until it is set)")
    graph = graph_beside(obj, keys)
    if graph is not None:
        return (f"its {who}'s attribute {graph} holds a tensor of the step's graph, which a checkpoint does not "
                f"carry, beside attributes that changed as it trained: a new process would start the "
                f"{kind}'s attributes anew (keep it detached: .detach())")
    return None


def with_places(kept: dict) -> dict:
    """`changed`'s attributes, with the names of those holding a tensor on the host under HOST: a restore puts the
    others' on the object's device, and these stay where the script kept them (`preds.cpu()` for a NumPy metric at
    the epoch's end: put on the GPU, they mixed devices with the ones appended after the restore)."""
    host = [k for k, v in kept.items() if any(t.device.type == "cpu" for t in tensors_in(v))]
    return {**kept, HOST: host} if host else kept


def fits_placed(obj, values) -> str | None:
    """`fits` for what `with_places` made (from a file): the values, and HOST naming only attributes among them."""
    if not isinstance(values, dict):
        return f"a {type(values).__name__}, not a dict"
    host = values.get(HOST, [])
    why = fits(obj, {k: v for k, v in values.items() if k != HOST})
    if why is None and not (type(host) is list and all(type(k) is str and k in values for k in host)):
        why = f"{HOST!r} is {host!r:.40}, not names of its attributes"
    return why


def placed(values: dict, device) -> dict:
    """What `fits_placed` passed, without HOST, the tensors on `device` (None: where they are) but the host's."""
    host = values.get(HOST, ())
    return {k: _to(v, None if k in host else device) for k, v in values.items() if k != HOST}


def put(obj, name: str, value) -> None:
    """Sets what `placed` gave back, into the list, dict or deque (of its maxlen), or NumPy array (of its dtype and
    shape), that `obj` holds there where there is one: the script may hold it elsewhere too (a loss weight made
    with torch.from_numpy over the counts), and a new one put there instead was no longer what that one saw."""
    now = vars(obj).get(name)
    if tagged_values.tagged(value) == tagged_values.GENERATOR:      # (may_take found one to take it)
        target = _generator_for(now, value)
        generators.apply(target, {"kind": value[tagged_values.GENERATOR], "state": value["state"]})
        if target is not now:
            setattr(obj, name, target)
    elif type(now) is list and type(value) is list:
        now[:] = value
    elif isinstance(now, dict) and type(now) is type(value):       # (a defaultdict keeps its own factory)
        now.clear()
        now.update(value)
    elif type(now) is collections.deque and type(value) is collections.deque and now.maxlen == value.maxlen:
        now.clear()
        now.extend(value)
    elif not tagged_values.fill(now, value):
        setattr(obj, name, value)


def tensors_in(value, out=None) -> list:
    """The tensors in a plain value (exactly torch.Tensor, in lists, tuples and dicts; not a NumPy value's bytes,
    which are the host's)."""
    out = [] if out is None else out
    if type(value) is torch.Tensor:
        out.append(value)
    elif type(value) in (list, tuple, dict) and tagged_values.tagged(value) not in (tagged_values.NUMPY,
                                                                                    tagged_values.GENERATOR):
        for v in value.values() if type(value) is dict else value:
            if type(v) not in _SCALARS:
                tensors_in(v, out)
    return out




def _to(value, device):
    if isinstance(value, torch.Tensor):
        return value if device is None else value.to(device)
    if tagged_values.tagged(value):
        return tagged_values.decode(value, lambda v: _to(v, device))
    if type(value) in (list, tuple):
        return type(value)(_to(v, device) for v in value)
    if type(value) is dict:
        return {k: _to(v, device) for k, v in value.items()}
    return value


def _numbers_in(value, budget: list, depth: int):
    """The type name of the first set or NumPy value a checkpoint does not hold in `value` (or random generator or
    defaultdict of the script's factory inside a container: one an attribute holds itself is carried), or of a key
    of a dict that is no str or int (a NumPy number, `self.counts[y] += 1` over an array's labels; a float, a
    bool), or a dict keyed as gmux tags one (looked into within bounds). `changed` leaves each out, with the
    object; unnamed, the move went on without its counts."""
    budget[0] -= 1
    kind = type(value)
    if issubclass(kind, (set, frozenset)) or (depth and (tagged_values.generator(value) or
                                                         tagged_values.own_factory(value))) or \
            (kind.__module__ == "numpy" and not tagged_values.numpy_value(value)):
        return kind.__name__
    dicts = (dict, *tagged_values.DICTS.values())
    if budget[0] < 0 or depth > MAX_DEPTH or kind not in (list, tuple, collections.deque, *dicts) or \
            tagged_values.scalars(value) or (kind in (list, tuple) and set(map(type, value)) <= _NUMBERS):
        return None
    if kind is dict and tagged_values.tagged(value):
        return f"dict keyed {tagged_values.tagged(value)!r}"
    for key, v in (value.items() if kind in dicts else zip(itertools.repeat(None), value)):
        # (a key `_plain` takes not, a float or a bool, `counts[label == y] += 1`, left the object out unnamed:
        # a moved run's callback counted from 0 again, and trained 9 steps past where the unmoved one stopped)
        if kind in dicts and type(key) not in (str, int):
            return f"dict keyed by {type(key).__name__} {_shown(key)}"
        found = _numbers_in(v, budget, depth + 1)
        if found is not None:
            return found
    return None


def fits(obj, values) -> str | None:
    """Why `values` (from a file) may not be set on `obj` (None: all of them may): each plain, within bounds, and
    of the kind `obj` holds under its name (`may_take`)."""
    if not isinstance(values, dict):
        return f"a {type(values).__name__}, not a dict"
    for name, value in values.items():
        if not (isinstance(name, str) and _plain(value, [MAX_ITEMS], 0) and may_take(obj, name, value)):
            return f"{str(name)[:40]!r} is {str(value)[:40]!r}, not plain data of the kind the object holds"
    return None


def may_take(obj, name: str, value) -> bool:
    """Whether the new object's attribute may take `value`: one it does not have yet (not a method or a special
    name), one holding None or what is not plain data (the moved process held `value` there), or one of its kind (a
    number, a bool among them, for a number; a list or tuple for either). A tensor the new object starts with may
    become anything plain: the moved process made it a number (`self.best = loss.item()`) or a new tensor; and a
    number may become a tensor of one value (`self.best = min(self.best, metrics["val_loss"])` from inf)."""
    now = vars(obj).get(name, _NEW)
    tag = tagged_values.tagged(value)
    if tag == tagged_values.GENERATOR or (tag == tagged_values.DICT and value[tag] == "defaultdict" and
                                          value.get("factory") is None):
        # (put into the new object's own: a defaultdict, whose factory is a lambda of the script's; a generator of
        # its kind, or a new one, the state tried on a scratch one first)
        if tag == tagged_values.DICT:
            return type(now) is collections.defaultdict
        try:
            target = _generator_for(now, value)
        except ValueError:
            return False
        # (a file's torch generator state is a TensorRef until its data is read: looked at again then)
        return _unread(value["state"]) or generators.problem({"kind": value[tag], "state": value["state"]},
                                                              target) is None
    if now is _NEW:
        return not name.startswith("__") and not callable(getattr(type(obj), name, None))
    return _of_kind(_takes(now), value)


def _takes(now):
    """The kind of value an attribute holding `now` may take: ANY where it holds None, a tensor or what is not plain
    data (the moved process held another value there), else `now`'s kind."""
    return ANY if now is None or type(now) is torch.Tensor or not _plain(now, [MAX_ITEMS], 0) else _kind(now)


def _of_kind(takes, value) -> bool:
    if takes is ANY or value is None:
        return True
    if takes == "number" and type(value) in (torch.Tensor, TensorRef):
        return type(value) is TensorRef or value.numel() == 1      # (a file's, before its data is read: any)
    return takes == _kind(value)


def kind_changed(obj, skip=frozenset()) -> str | None:
    """An attribute of `obj` (not in `skip`) that holds plain data of another kind than when `remember` saw it (a
    count that became a string), as "'name' was a number at the start and is a str now"; None if there is none.
    The new process's object, built alike, holds the first kind, and its restore (`may_take`) refuses the other:
    the reports had said movable, and the move ended in the new process. None too where `changed` leaves the
    object out whole (another attribute changed into what is not plain data): the restore puts none of its
    attributes back, as before."""
    try:
        then = _takes_then.get(obj)
    except TypeError:
        return None
    for name, value in vars(obj).items() if then else ():
        takes = then.get(name, ANY)
        if name not in skip and not issubclass(type(value), _WIRING) and not tagged_values.generator(value) and \
                not _of_kind(takes, value) and _plain(value, [MAX_ITEMS], 0):
            if not changed(obj, skip):      # (looked at only once one is found: a look of every attribute)
                return None
            then_kind = getattr(takes, "__name__", takes)
            return f"{name!r} was a {then_kind} at the start and is a {type(value).__name__} now"
    return None


ANY = "any"
_NEW = object()
_NUMBERS = frozenset((type(None), bool, int, float))
_SCALARS = _NUMBERS | {str}
# (an attribute's value is known by its type throughout: isinstance() asks a weak proxy its referent's class, and a
# module holding one whose referent is gone raised ReferenceError out of attach())
# Functions an object was given, not state it keeps (Lightning sets each callback's log to the module's)
_WIRING = (types.FunctionType, types.MethodType, types.BuiltinFunctionType, functools.partial)
_seen: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()     # object -> {attribute: _look(value)} then
_takes_then: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()   # object -> {attribute: _takes(value)} then


def _generator_for(now, value):
    """The generator a tagged one's state goes into: the new object's own, of its kind (and device), or a new one
    (a callback that makes its own in a hook a restore has not run yet); ValueError where none can be made."""
    kind, device = value[tagged_values.GENERATOR], value.get("device", "cpu")
    if tagged_values.generator(now) and generators.kind_of(now) == kind and \
            (kind != "torch" or now.device.type == device):
        return now
    return generators.new(kind, value["state"], device)


def _shown(value) -> str:
    try:
        return f"{value!r:.20}"
    except Exception:       # (a key of the script's whose repr raises: named by its type alone, at a boundary)
        return ""


def _unread(state) -> bool:
    return type(state) is TensorRef or (type(state) in (list, tuple) and any(type(v) is TensorRef for v in state))


def _look(value, budget: list | None = None):
    """What to compare a later look with: plain values as they are, a tensor by its identity and version counter
    (changed in place or made again), anything else by identity; a container item by item, within bounds."""
    budget = [MAX_ITEMS] if budget is None else budget
    budget[0] -= 1
    if issubclass(type(value), torch.Tensor):
        return ("tensor", _Same(value), value._version if not value.is_inference() else 0)
    if value is None or type(value) in (bool, int, str):
        return value
    if type(value) is float:
        return ("float", repr(value))       # (nan == nan)
    if type(value) in (set, frozenset, collections.deque):
        # (grown, emptied or changed in place: changed. By its items too: a window of the last losses, a deque
        # made full at its maxlen, keeps its length as it changes, and was taken for unchanged and left behind)
        items = tuple(_look(v, budget) for v in value) if budget[0] >= 0 else None
        return ("object", id(value), len(value), items)
    if tagged_values.scalars(value):        # (a loss per step from np.mean: by its bytes, at once)
        import numpy as np
        budget[0] -= len(value)
        return (type(value).__name__, id(value), type(value[0]).__name__, np.array(value).tobytes())
    if type(value) in (list, tuple) and set(map(type, value)) <= _NUMBERS:
        budget[0] -= len(value)     # (as they are: a NaN among them is taken for a change, and carried)
        return (type(value).__name__, id(value), tuple(value))
    if type(value) in (list, tuple, dict, *tagged_values.DICTS.values()) and budget[0] >= 0:
        # (a defaultdict, a Counter, an OrderedDict counted into in place too: by identity alone it was taken for
        # unchanged, neither carried nor named)
        items = value.items() if issubclass(type(value), dict) else enumerate(value)
        return (type(value).__name__, id(value), tuple((k, _look(v, budget)) for k, v in items))
    if type(value).__name__ == "ndarray" and type(value).__module__ == "numpy":
        # (counted into in place, `self.seen[y] += 1`, it is the same object: by its bytes, a sample of a large one.
        # By identity alone it was taken for unchanged, neither carried nor named, its job said movable)
        # (.flat's slice copies only the sample, of a transposed array too)
        return ("array", _Same(value), value.dtype.str, value.shape,
                (value if value.nbytes <= _ARRAY_BYTES else value.flat[::max(1, value.size // 4096)]).tobytes())
    if tagged_values.generator(value):
        # (drawn from, it is the same object: by its state. By identity a callback's random.Random was taken for
        # unchanged, and a moved run's drew from its seed again, unnamed)
        return ("generator", _Same(value), _state_of(value))
    if type(value).__module__ == "numpy" and hasattr(value, "dtype") and hasattr(value, "tobytes"):
        # (a NumPy scalar takes no weak reference, and one made again at the address of the last was unchanged)
        return ("scalar", value.dtype.str, value.tobytes())
    return ("object", _Same(value), len(value) if type(value) in (list, tuple, dict) else None)


def _state_of(generator):
    """The generator's state as a checkpoint captures it, its tensors as bytes (compared with ==)."""
    try:
        state = generators.capture(generator)["state"]
    except Exception:       # (a look runs at a boundary: it must not end the training; unread, as by identity)
        return None
    return tuple(map(_bytes_of, state)) if type(state) is tuple else _bytes_of(state)


def _bytes_of(value):
    return value.numpy().tobytes() if type(value) is torch.Tensor else value


_ARRAY_BYTES = 1 << 16      # an array's bytes compared whole up to this; a larger one's by 4096 of its items


class _Same:
    """An object's identity, which outlives it: an id alone is reused once its object is freed, and a cache made
    again at its predecessor's address was taken for unchanged (the length that sized it was carried without it),
    as was a tensor made anew there (`self.stat = 0.9 * self.stat + ...`). Held weakly: a look keeps nothing
    alive."""
    __slots__ = ("ref", "key")

    def __init__(self, value):
        self.key = id(value)
        try:
            self.ref = weakref.ref(value)
        except TypeError:       # (a list, a dict: compared item by item besides)
            self.ref = None

    def __eq__(self, other) -> bool:
        if type(other) is not _Same or self.key != other.key:
            return False
        if self.ref is None or other.ref is None:
            return self.ref is other.ref
        return self.ref() is not None and self.ref() is other.ref()

    __hash__ = None


def _kind(v):
    # (a flag that becomes a count, `warm = False` then `warm = 3`: both numbers; a NumPy float too)
    # (a tensor read back from a file is a TensorRef until its data is read)
    return "number" if type(v) in (bool, int, float) else list if type(v) is tuple else \
        torch.Tensor if type(v) is TensorRef else tagged_values.kind(v) or type(v)


def _plain(value, budget: list, depth: int) -> bool:
    budget[0] -= 1
    if budget[0] < 0 or depth > MAX_DEPTH:
        return False
    if value is None or type(value) in (bool, int, float):
        return True
    if type(value) is str:
        return len(value) <= MAX_TEXT
    if type(value) is torch.Tensor:
        # An attribute that is a tensor itself is state as much as one in a list: a running statistic the forward
        # makes anew (`self.stat = 0.9 * self.stat + 0.1 * x.abs().mean()`), left to the new process, started
        # again there, and a moved run's weights ended up 0.10 from an unmoved one's. One in a graph (an
        # activation kept for a hook) is its step's, made again by the next forward: the module is left to the new
        # process, as before. (One a checkpoint cannot hold, a uint16 or a nested tensor, failed every checkpoint.)
        return not (depth == 0 and value.requires_grad) and value.layout == torch.strided and \
            not (value.is_meta or value.is_nested) and str(value.dtype).removeprefix("torch.") in DTYPES
    if type(value) is TensorRef:       # (a checkpoint's, before its data is read)
        return True
    if tagged_values.numpy_value(value) or (depth == 0 and tagged_values.generator(value)):
        return True     # (a generator inside a container is not: put() fills the one an attribute holds)
    if depth and tagged_values.own_factory(value):
        return False    # (nor a defaultdict of the script's factory: put() fills the one an attribute holds)
    if tagged_values.scalars(value) or (type(value) in (list, tuple) and set(map(type, value)) <= _NUMBERS):
        budget[0] -= len(value)      # (a list of 100,000 losses, at every command: looked at by C loops only)
        return budget[0] >= 0
    if type(value) in (list, tuple, collections.deque):
        return all(_plain(v, budget, depth + 1) for v in value)
    if tagged_values.tagged(value):         # (a file's)
        return tagged_values.fits(value, lambda v: _plain(v, budget, depth + 1))
    if type(value) is dict or type(value) in tagged_values.DICTS.values():
        return all(type(k) in (str, int) and _plain(v, budget, depth + 1) for k, v in value.items())
    return False
