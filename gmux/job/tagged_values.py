"""NumPy values, deques, dicts of collections' kinds and random generators among the attributes a move carries
(gmux.job.plain_values), in a form a checkpoint holds and back, exactly: a NumPy scalar or array as its bytes in a
tensor, tagged with which it was; a deque as its items and its maxlen; a defaultdict, Counter or OrderedDict as its
items and its kind; a generator as its state, put into the one the new object holds (or a new one of its kind).

A best loss that np.mean() made a NumPy float, a count of correct predictions kept in an array (`self.hits[y] +=
1`), a window of the last losses in a deque(maxlen=100): a move refused such a job rather than lose them, or (a
callback's, before it was named) lost them. Put back, each is what it was: an np.float32 stays one (its arithmetic
is float32's), an array keeps its dtype and shape, a deque its maxlen. Only native-endian NumPy values of the dtypes
a checkpoint holds are carried (a string or object array is not); a set is not (its order of iteration is not
carried with it). A defaultdict whose factory is not a builtin type (a lambda) is put into the one the new object
holds (where it holds none, the restore is refused).
"""
from __future__ import annotations

import collections
import sys
from typing import Callable, Optional

import torch

from . import generators
from .checkpoint import DTYPES, TensorRef

NUMPY = "__gmux_numpy__"    # -> "scalar", "array", or "list"/"tuple" of scalars; beside it "data", a tensor
DEQUE = "__gmux_deque__"    # -> its maxlen (None or a count); beside it "items", a list
DICT = "__gmux_dict__"      # -> its class's name; beside it "items", a dict, and a defaultdict's "factory"
GENERATOR = "__gmux_generator__"    # -> its kind (gmux.job.generators); beside it "state"
DICTS = {cls.__name__: cls for cls in (collections.defaultdict, collections.Counter, collections.OrderedDict)}
# a defaultdict's factory, by name, where it is a builtin type (any other is the new object's own defaultdict's)
FACTORIES = {cls.__name__: cls for cls in (list, dict, int, float, str, tuple, bool)}
_TORCH_ONLY = ("bfloat16", "float8_e4m3fn", "float8_e5m2")      # (NumPy has no such dtype)


def own_factory(value) -> bool:
    """A defaultdict whose factory is the script's (a lambda, a functools.partial, a class of its own), not a builtin
    type: its items are put into the new object's own defaultdict, which has it (one inside a list or dict is not
    carried: put back without a factory, `counts[key] += 1` raised a KeyError after the move). Read by its type and
    getattr: a partial has no __name__, and raised an AttributeError out of the checkpoint at a boundary."""
    if type(value) is not collections.defaultdict or value.default_factory is None:
        return False
    factory = value.default_factory
    return FACTORIES.get(getattr(factory, "__name__", None)) is not factory


def generator(value) -> bool:
    """A random generator of a kind gmux.job.generators keeps (by its type: isinstance() asks a weak proxy its
    referent's class, and raised for one whose referent is gone)."""
    return issubclass(type(value), _GENERATORS)


_GENERATORS = tuple(generators.KINDS.values())


def numpy_value(value) -> bool:
    """A NumPy scalar or array (exactly) a checkpoint holds."""
    kind = type(value)
    if kind.__module__ != "numpy" or not hasattr(value, "dtype"):
        return False
    import numpy as np
    return (kind is np.ndarray or isinstance(value, np.generic)) and value.dtype.isnative and \
        value.dtype.name in DTYPES and value.dtype.name not in _TORCH_ONLY


def scalars(value) -> bool:
    """A list or tuple of NumPy scalars of one type a checkpoint holds (a loss per step from np.mean): carried as
    one array, not as a tensor for each (100,000 of them took 5 s to write and 8 s to read back)."""
    if type(value) not in (list, tuple) or not value:
        return False
    first = type(value[0])
    return first.__module__ == "numpy" and first.__name__ != "ndarray" and set(map(type, value)) == {first} and \
        numpy_value(value[0])


def encode(value):
    """`value` with the NumPy values and deques in it tagged (the same object where it holds none: its tensors
    stay the script's, read as a checkpoint is written). ValueError for a dict of the script's that holds a tag's
    key: read back, it would be taken for a tagged one (`{"__gmux_deque__": None, "items": [1]}` came back a
    deque)."""
    if numpy_value(value):
        import numpy as np
        if type(value) is not np.ndarray:
            return {NUMPY: "scalar", "data": torch.from_numpy(np.array(value))}
        # Its axes in the order its memory holds them (a transposed array's, a Fortran-ordered one's), under
        # "axes": NumPy sums in the order of memory, and the C-ordered copy put back summed otherwise (another
        # float32 total, in its last bit)
        axes = list(range(value.ndim)) if value.flags.c_contiguous else \
            sorted(range(value.ndim), key=lambda i: -abs(value.strides[i]))
        array = value.transpose(axes)
        array = array if array.flags.c_contiguous and array.flags.writeable else \
            np.array(array, order="C")      # (torch takes no read-only memory)
        out = {NUMPY: "array", "data": torch.from_numpy(array)}
        return out if axes == sorted(axes) else {**out, "axes": axes}
    if scalars(value):
        import numpy as np
        return {NUMPY: type(value).__name__, "data": torch.from_numpy(np.array(value))}
    if type(value) is collections.deque:
        return {DEQUE: value.maxlen, "items": [encode(v) for v in value]}
    if type(value) in DICTS.values():
        out = {DICT: type(value).__name__, "items": {k: encode(v) for k, v in value.items()}}
        if type(value) is collections.defaultdict:
            out["factory"] = None if own_factory(value) else getattr(value.default_factory, "__name__", None)
        return out
    if generator(value):
        out = {GENERATOR: generators.kind_of(value), "state": generators.capture(value)["state"]}
        return {**out, "device": value.device.type} if out[GENERATOR] == "torch" else out
    if type(value) in (list, tuple, dict) and \
            set(map(type, value.values() if type(value) is dict else value)) <= _AS_THEY_ARE and not tagged(value):
        return value        # (a list of 100,000 floats, at every command: looked at by C loops only)
    if type(value) in (list, tuple):
        items = [encode(v) for v in value]
        return value if all(a is b for a, b in zip(items, value)) else type(value)(items)
    if type(value) is dict:
        if tagged(value):
            raise ValueError(f"a dict keyed {tagged(value)!r}")
        items = {k: encode(v) for k, v in value.items()}
        return value if all(items[k] is v for k, v in value.items()) else items
    return value


_AS_THEY_ARE = frozenset((type(None), bool, int, float, str, torch.Tensor))


def tagged(value) -> Optional[str]:
    """Which tag a dict carries (NUMPY, DEQUE, DICT, GENERATOR), or None."""
    if type(value) is dict:
        for tag in (NUMPY, DEQUE, DICT, GENERATOR):
            if tag in value:
                return tag
    return None


def fits(value: dict, plain: Callable) -> bool:
    """Whether a tagged dict read from a file decodes to what it claims: a NumPy value's data a tensor (a
    TensorRef before it is read) of a dtype NumPy has, one value for a scalar, an array's "axes" (where given) an
    order of its dimensions; a deque's items a list of plain values (`plain`) no longer than its maxlen, which a
    deque can take (a file's maxlen of 2**63 passed, and the restore failed with an OverflowError half-way through
    putting the job back)."""
    tag = tagged(value)
    if tag == NUMPY:
        data = value.get("data")
        axes = value.get("axes")
        if set(value) - {"axes"} != {NUMPY, "data"} or value[NUMPY] not in ("scalar", "array", "list", "tuple") or \
                not (axes is None or (type(axes) is list and all(type(a) is int for a in axes) and
                                      value[NUMPY] == "array")):
            return False
        if type(data) is TensorRef:
            return True
        return type(data) is torch.Tensor and (axes is None or sorted(axes) == list(range(data.dim()))) and \
            data.layout == torch.strided and not data.requires_grad and \
            str(data.dtype).removeprefix("torch.") in DTYPES and \
            str(data.dtype).removeprefix("torch.") not in _TORCH_ONLY and \
            data.dim() == {"scalar": 0, "list": 1, "tuple": 1}.get(value[NUMPY], data.dim())
    if tag == DICT:
        items, factory = value.get("items"), value.get("factory")
        return value[DICT] in DICTS and set(value) - {"factory"} == {DICT, "items"} and type(items) is dict and \
            (factory is None or (value[DICT] == "defaultdict" and factory in FACTORIES)) and \
            all(type(k) in (str, int) and plain(v) for k, v in items.items())
    if tag == GENERATOR:        # (its state is checked against the generator it is put into: plain_values.may_take)
        return set(value) - {"device"} == {GENERATOR, "state"} and value[GENERATOR] in generators.KINDS and \
            value.get("device", "cpu") in ("cpu", "cuda")
    if tag == DEQUE:
        items, maxlen = value.get("items"), value[DEQUE]
        return set(value) == {DEQUE, "items"} and type(items) is list and all(map(plain, items)) and \
            (maxlen is None or (type(maxlen) is int and len(items) <= maxlen <= sys.maxsize))
    return False


def decode(value: dict, inner: Callable):
    """What a tagged dict `fits` passed stood for; `inner` puts a deque's and a dict's items back. A generator's
    stays tagged: it is put into the new object's own (plain_values.put)."""
    if tagged(value) == GENERATOR:
        return value
    if tagged(value) == DICT:
        items = {k: inner(v) for k, v in value["items"].items()}
        if value[DICT] == "defaultdict":
            return collections.defaultdict(FACTORIES.get(value.get("factory")), items)
        return DICTS[value[DICT]](items)
    if tagged(value) == NUMPY:
        array = value["data"].detach().cpu().numpy()
        if "axes" in value:
            import numpy as np
            array = array.transpose(np.argsort(value["axes"]))
        form = value[NUMPY]
        return array[()] if form == "scalar" else list(array) if form == "list" else tuple(array) \
            if form == "tuple" else array
    return collections.deque((inner(v) for v in value["items"]), maxlen=value[DEQUE])


def fill(now, value) -> bool:
    """Copies an array into `now` where `now` is a writable array of its dtype, shape and memory order (NumPy sums
    in that order: one of another is replaced); whether it did."""
    if type(now).__name__ != "ndarray" or type(value) is not type(now) or now.dtype != value.dtype or \
            now.shape != value.shape or now.strides != value.strides or not now.flags.writeable:
        return False
    now[...] = value
    return True


def kind(value):
    """"number" for a NumPy scalar, "ndarray" for an array, "deque" for a deque, dict for a dict of any of DICTS,
    "generator" for a generator, tagged or not; list for a tagged list or tuple of scalars; else None. (A `{}` the
    script made a Counter is of a kind.)"""
    tag = tagged(value)
    if tag == DICT or type(value) in DICTS.values():
        return dict
    if tag == GENERATOR or generator(value):
        return "generator"
    if tag == NUMPY:
        return {"scalar": "number", "array": "ndarray"}.get(value[NUMPY], list)
    if tag == DEQUE or type(value) is collections.deque:
        return "deque"
    if numpy_value(value):
        return "ndarray" if type(value).__name__ == "ndarray" else "number"
    return None
