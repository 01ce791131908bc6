"""The checkpoint skeleton's decoder: the subset of pickle gmux writes, read with bounded time, memory and depth.

A checkpoint file is untrusted input, and Python's unpickler is not safe against it even behind an allow-list
of classes: a few hundred bytes of shared references stand for billions of values once expanded (each copy
of the skeleton, and each walk over it, expands them); a million nested tuples used as a dict key overflow
the C stack while hashing (the process dies); a bytes opcode claiming a terabyte is allocated before its data
is read. So the skeleton is interpreted here, opcode by opcode, and every value built carries two numbers:
its depth and its size once expanded (shared references counted each time they appear). A value deeper than
MAX_DEPTH, or a skeleton expanding to more values than `budget`, is refused while it is being decoded;
lengths are checked against the bytes actually there; a value is never mutated once it has been referred to
again (so its numbers stay true) and never refers to itself. The decoder's own memory and time are bounded
too: its stack, marks and memo hold at most `budget` entries, and it runs at most OPS_PER_VALUE * `budget`
opcodes (each opcode takes at least a byte, so a skeleton under MAX_VALUES bytes never meets that bound). At
about 1 us an opcode, the worst case (a skeleton of 16 MiB or more) is refused within seconds.

What gmux writes (pickle protocol 5 of dicts, lists, tuples, sets, str, bytes, numbers, None, OrderedDict,
Counter, complex, TensorRef and SparseRef) decodes to the same value as pickle.loads; protocol 2-4 files of the
same values too.
"""
from __future__ import annotations

import collections
import struct

MAX_DEPTH = 100          # gmux's own snapshot is about 7 deep; the rest is the job's state= values
SLACK = 4096             # values allowed beyond one per byte of skeleton (see decode)
MAX_VALUES = 1 << 21     # whatever its length: a model with 100,000 tensors and Adam has about 10**6 values
OPS_PER_VALUE = 8        # a TensorRef in a dict costs 12 opcodes for 5 values (its key, itself, its dict of one)
_GLOBAL = object()


class SkeletonError(ValueError):
    """The skeleton is not one gmux writes, or costs more to decode than it could legitimately."""


class _Unbuilt:
    """What NEWOBJ pushes: an object of one of the `builders`' classes, whose fields the BUILD that follows gives."""
    __slots__ = ("ctor",)

    def __init__(self, ctor):
        self.ctor = ctor


class _Value:
    """A value on the stack or in the memo, with its depth and expanded size."""
    __slots__ = ("obj", "depth", "size", "open", "kind")

    def __init__(self, obj, depth=0, size=1, kind=None):
        self.obj, self.depth, self.size, self.kind = obj, depth, size, kind
        self.open = kind is not None     # a container being filled, not yet placed anywhere


def decode(data: bytes, builders: tuple, allowed: dict, budget: int | None = None):
    """Decodes a pickled skeleton. `allowed` maps (module, name) to the constructor used for it; `builders` are
    those of its constructors that NEWOBJ and BUILD make, each from its state dict (a TensorRef, a SparseRef).
    `budget` bounds the expanded size (default: one value per byte of skeleton plus SLACK; gmux's own skeletons
    share only strings, so they expand to fewer values than bytes)."""
    decoder = _Decoder(bytes(data), builders, allowed,
                       min(len(data) + SLACK, MAX_VALUES) if budget is None else budget)
    try:
        return decoder.run()
    except SkeletonError:
        raise
    except Exception as e:  # untrusted input: any failure to build a value is a refusal, named
        raise SkeletonError(f"a value that cannot be built at byte {decoder.at} ({type(e).__name__}: "
                            f"{str(e)[:200]})") from None


MAPPINGS = (dict, collections.OrderedDict, collections.Counter)     # (Counter: MultiStepLR's milestones)
_PLAIN = (type(None), bool, int, float, complex, str, bytes, bytearray, set, frozenset)


def unstorable(obj, leaves: tuple) -> str:
    """Where in a value the first one lies that no skeleton holds, as a refusal says it (" (at
    schedulers[0]['milestones'])"), `leaves` being the writer's own (its tensors, references): asked once a write
    failed. '' where none lies anywhere (the value is too deep or too large)."""
    where = _unstorable(obj, leaves, "")
    return f" (at {where})" if where else ""


def _unstorable(obj, leaves: tuple, where: str) -> str:
    if type(obj) in MAPPINGS:
        items = obj.items()
    elif type(obj) in (list, tuple):
        items = enumerate(obj)
    else:
        return "" if isinstance(obj, _PLAIN + leaves) else where or "(the whole value)"
    for k, v in items:
        found = _unstorable(v, leaves, f"{where}[{k!r}]" if where or not isinstance(k, str) else k)
        if found:
            return found
    return ""


class _Decoder:
    def __init__(self, data, builders, allowed, budget):
        self.data, self.at = data, 0
        self.builders, self.allowed, self.budget = builders, allowed, budget
        self.stack: list[_Value] = []
        self.marks: list[int] = []
        self.memo: dict[int, _Value] = {}

    # -- reading the opcode stream --------------------------------------------------------------------
    def take(self, n: int) -> bytes:
        at = self.at
        if n < 0 or n > len(self.data) - at:
            raise SkeletonError(f"truncated: {n} bytes claimed at byte {at}, {len(self.data) - at} left")
        self.at = at + n
        return self.data[at:at + n]

    def unpack(self, fmt: str):
        s = _STRUCTS[fmt]
        if self.at + s.size > len(self.data):
            raise SkeletonError(f"truncated at byte {self.at}")
        (value,) = s.unpack_from(self.data, self.at)
        self.at += s.size
        return value

    def counted(self, fmt: str) -> bytes:
        return self.take(self.unpack(fmt))

    # -- the stack ----------------------------------------------------------------------------------------
    def push(self, v: _Value) -> None:
        if len(self.stack) >= self.budget or v.depth > MAX_DEPTH or v.size > self.budget:
            if v.depth > MAX_DEPTH:
                raise SkeletonError(f"a value nested deeper than {MAX_DEPTH} levels")
            if v.size > self.budget:
                raise SkeletonError(f"shared references that expand to more than {self.budget} values")
            raise SkeletonError(f"more than {self.budget} values waiting on the stack")
        self.stack.append(v)

    def pop(self) -> _Value:
        if not self.stack or (self.marks and len(self.stack) == self.marks[-1]):
            raise SkeletonError(f"stack underflow at byte {self.at}")
        return self.stack.pop()

    def pop_mark(self) -> list[_Value]:
        if not self.marks:
            raise SkeletonError(f"no mark at byte {self.at}")
        at = self.marks.pop()
        items, self.stack[at:] = self.stack[at:], []
        return items

    def placed(self, v: _Value):
        """`v` goes into a container: it must be whole, and can no longer change."""
        if v.obj is _GLOBAL or type(v.obj) is _Unbuilt:
            raise SkeletonError(f"a class or an unfinished value used as data at byte {self.at}")
        v.open = False
        return v.obj

    def target(self, kind: str, op: str) -> _Value:
        """The container an APPEND/SETITEM/ADDITEMS/BUILD fills: one just made, not one referred to again."""
        if not self.stack or self.stack[-1].kind != kind:
            raise SkeletonError(f"{op} at byte {self.at} does not follow a new {kind}")
        if not self.stack[-1].open:
            raise SkeletonError(f"{op} at byte {self.at} changes a {kind} already referred to (or a cycle)")
        return self.stack[-1]

    def grow(self, container: _Value, children: list[_Value]) -> None:
        container.depth = max([container.depth] + [c.depth + 1 for c in children])
        container.size += sum(c.size for c in children)
        if container.depth > MAX_DEPTH:
            raise SkeletonError(f"a value nested deeper than {MAX_DEPTH} levels")
        if container.size > self.budget:
            raise SkeletonError(f"shared references that expand to more than {self.budget} values")

    def built(self, obj, children: list[_Value]) -> _Value:
        v = _Value(obj)
        self.grow(v, children)
        return v

    # -- the opcodes --------------------------------------------------------------------------------------
    def run(self):
        ops, left, data = _DISPATCH, OPS_PER_VALUE * self.budget, self.data
        while True:
            left -= 1
            if left < 0:
                raise SkeletonError(f"more than {OPS_PER_VALUE * self.budget} opcodes")
            if self.at >= len(data):
                raise SkeletonError("truncated: no STOP opcode")
            op = data[self.at]
            self.at += 1
            handler = ops[op]
            if handler is None:
                raise SkeletonError(f"opcode {bytes([op])!r} at byte {self.at - 1}, which gmux never writes")
            if handler is _stop:
                if len(self.stack) != 1 or self.marks:
                    raise SkeletonError("the skeleton does not end with exactly one value")
                if self.at != len(self.data):
                    raise SkeletonError(f"{len(self.data) - self.at} bytes after the end of the skeleton")
                return self.placed(self.stack.pop())
            handler(self)


def _leaf(read):
    def handler(d: _Decoder):
        d.push(_Value(read(d)))
    return handler


def _empty(factory, kind):
    def handler(d: _Decoder):
        d.push(_Value(factory(), kind=kind))
    return handler


def _from_mark(build):
    def handler(d: _Decoder):
        items = d.pop_mark()
        d.push(d.built(build([d.placed(v) for v in items]), items))
    return handler


def _tuple_n(n):
    def handler(d: _Decoder):
        items = [d.pop() for _ in range(n)][::-1]
        d.push(d.built(tuple(d.placed(v) for v in items), items))
    return handler


def _append(d: _Decoder):
    v = d.pop()
    lst = d.target("list", "APPEND")
    lst.obj.append(d.placed(v))
    d.grow(lst, [v])


def _appends(d: _Decoder):
    items = d.pop_mark()
    lst = d.target("list", "APPENDS")
    lst.obj.extend(d.placed(v) for v in items)
    d.grow(lst, items)


def _setitems_of(pairs: list[_Value], d: _Decoder, op: str):
    if len(pairs) % 2:
        raise SkeletonError(f"{op} at byte {d.at} with an odd number of items")
    target = d.target("dict", op)
    for k, v in zip(pairs[::2], pairs[1::2]):
        target.obj[d.placed(k)] = d.placed(v)     # keys are at most MAX_DEPTH deep: hashing them is bounded
    d.grow(target, pairs)


def _setitem(d: _Decoder):
    v = d.pop()
    k = d.pop()
    _setitems_of([k, v], d, "SETITEM")


def _setitems(d: _Decoder):
    _setitems_of(d.pop_mark(), d, "SETITEMS")


def _additems(d: _Decoder):
    items = d.pop_mark()
    s = d.target("set", "ADDITEMS")
    s.obj.update(d.placed(v) for v in items)
    d.grow(s, items)


def _memoize_at(index_of):
    def handler(d: _Decoder):
        if not d.stack:
            raise SkeletonError(f"MEMOIZE of nothing at byte {d.at}")
        if len(d.memo) >= d.budget:
            raise SkeletonError(f"more than {d.budget} memo entries")
        d.memo[index_of(d)] = d.stack[-1]
    return handler


def _get(index_of):
    def handler(d: _Decoder):
        i = index_of(d)
        v = d.memo.get(i)
        if v is None:
            raise SkeletonError(f"a reference to memo slot {i}, which holds nothing")
        if v.obj is _GLOBAL:
            d.push(v)
            return
        # Referred to again, a value is final: filling it now could make it contain itself (a cycle) or grow
        # the values already counted with it.
        v.open = False
        d.push(_Value(v.obj, v.depth, v.size))
    return handler


def _global_of(d: _Decoder, module: str, name: str):
    ctor = d.allowed.get((module, name))
    if ctor is None:
        raise SkeletonError(f"a value of type {module}.{name}")
    v = _Value(_GLOBAL)
    v.kind = ("global", ctor)
    d.push(v)


def _stack_global(d: _Decoder):
    name, module = d.placed(d.pop()), d.placed(d.pop())
    if not (isinstance(module, str) and isinstance(name, str)):
        raise SkeletonError(f"STACK_GLOBAL at byte {d.at} without a module and a name")
    _global_of(d, module, name)


def _global(d: _Decoder):
    module = _line(d)
    _global_of(d, module, _line(d))


def _line(d: _Decoder) -> str:
    end = d.data.find(b"\n", d.at, d.at + 256)
    if end < 0:
        raise SkeletonError(f"GLOBAL at byte {d.at} without a name")
    out = d.take(end - d.at + 1)[:-1]
    return out.decode("ascii", "strict")


def _callable(d: _Decoder, op: str):
    args = d.pop()
    cls = d.pop()
    if not (isinstance(cls.kind, tuple) and cls.kind[0] == "global"):
        raise SkeletonError(f"{op} at byte {d.at} of something that is not an allowed class")
    if not isinstance(args.obj, tuple):
        raise SkeletonError(f"{op} at byte {d.at} without an argument tuple")
    return cls.kind[1], args


def _reduce(d: _Decoder):
    ctor, args = _callable(d, "REDUCE")
    if ctor is collections.OrderedDict:
        if args.obj:
            raise SkeletonError("an OrderedDict built from arguments")
        d.push(_Value(collections.OrderedDict(), kind="dict"))    # filled by SETITEM(S), like a dict
        return
    if ctor is complex:
        if not (len(args.obj) <= 2 and all(type(a) in (int, float) for a in args.obj)):
            raise SkeletonError("a complex number built from something other than two numbers")
    elif ctor in (set, frozenset):
        if not (len(args.obj) <= 1 and all(type(a) in (list, tuple) for a in args.obj)):
            raise SkeletonError("a set built from something other than a list")
    elif ctor is collections.Counter:  # (MultiStepLR's milestones): Counter(a dict), as pickle writes it
        if not (len(args.obj) == 1 and type(args.obj[0]) is dict):
            raise SkeletonError("a Counter built from something other than a dict")
    elif ctor is bytearray:            # protocols 3-4 write bytearray(b"..."); never bytearray(n), an allocation
        if not (len(args.obj) == 1 and type(args.obj[0]) is bytes):
            raise SkeletonError("a bytearray built from something other than bytes")
    else:
        raise SkeletonError(f"REDUCE at byte {d.at} of {ctor.__name__}")
    try:
        obj = ctor(*d.placed(args))
    except TypeError as e:                                        # unhashable members of a set
        raise SkeletonError(f"a {ctor.__name__} that cannot be built: {e}") from None
    d.push(d.built(obj, [args]))


def _newobj(d: _Decoder):
    ctor, args = _callable(d, "NEWOBJ")
    if ctor not in d.builders or args.obj != ():
        raise SkeletonError(f"NEWOBJ at byte {d.at} of {getattr(ctor, '__name__', ctor)}")
    d.push(_Value(_Unbuilt(ctor), kind="ref"))                    # made whole by the BUILD that follows


def _build(d: _Decoder):
    state = d.pop()
    ref = d.target("ref", "BUILD")
    if type(ref.obj) is not _Unbuilt:
        raise SkeletonError(f"BUILD at byte {d.at} of a reference already built")
    ref.obj = ref.obj.ctor(d.placed(state))
    ref.kind = "built"
    d.grow(ref, [state])          # (a SparseRef's fields are values of the skeleton too)


def _stop(d: _Decoder):   # handled in run(); here to be found in _OPS
    raise AssertionError


def _frame(d: _Decoder):
    d.unpack("<Q")        # a hint for buffered readers: the whole skeleton is already in memory


def _proto(d: _Decoder):
    if d.take(1)[0] > 5:
        raise SkeletonError("a pickle protocol newer than 5")


def _mark(d: _Decoder):
    if len(d.marks) >= d.budget:
        raise SkeletonError(f"more than {d.budget} marks")
    d.marks.append(len(d.stack))


def _text(fmt):
    def read(d: _Decoder) -> str:
        raw = d.counted(fmt)
        try:
            return raw.decode("utf-8", "surrogatepass")
        except UnicodeDecodeError:
            raise SkeletonError(f"a string that is not UTF-8 before byte {d.at}") from None
    return read


def _long(fmt):
    def read(d: _Decoder) -> int:
        return int.from_bytes(d.counted(fmt), "little", signed=True)
    return read


_OPS = {
    b"\x80": _proto, b"\x95": _frame, b".": _stop, b"(": _mark,
    b"N": _leaf(lambda d: None), b"\x88": _leaf(lambda d: True), b"\x89": _leaf(lambda d: False),
    b"K": _leaf(lambda d: d.take(1)[0]), b"M": _leaf(lambda d: d.unpack("<H")),
    b"J": _leaf(lambda d: d.unpack("<i")), b"\x8a": _leaf(_long("<B")), b"\x8b": _leaf(_long("<i")),
    b"G": _leaf(lambda d: d.unpack(">d")),
    b"\x8c": _leaf(_text("<B")), b"X": _leaf(_text("<I")), b"\x8d": _leaf(_text("<Q")),
    b"C": _leaf(lambda d: d.counted("<B")), b"B": _leaf(lambda d: d.counted("<I")),
    b"\x8e": _leaf(lambda d: d.counted("<Q")), b"\x96": _leaf(lambda d: bytearray(d.counted("<Q"))),
    b"]": _empty(list, "list"), b"}": _empty(dict, "dict"), b"\x8f": _empty(set, "set"),
    b")": _leaf(lambda d: ()),
    b"a": _append, b"e": _appends, b"s": _setitem, b"u": _setitems, b"\x90": _additems,
    b"t": _from_mark(tuple), b"l": _from_mark(list), b"\x91": _from_mark(frozenset),
    b"\x85": _tuple_n(1), b"\x86": _tuple_n(2), b"\x87": _tuple_n(3),
    b"\x94": _memoize_at(lambda d: len(d.memo)),
    b"q": _memoize_at(lambda d: d.unpack("<B")), b"r": _memoize_at(lambda d: d.unpack("<I")),
    b"h": _get(lambda d: d.take(1)[0]), b"j": _get(lambda d: d.unpack("<I")),
    b"\x93": _stack_global, b"c": _global, b"R": _reduce, b"\x81": _newobj, b"b": _build,
}
_DISPATCH = [_OPS.get(bytes([i])) for i in range(256)]
_STRUCTS = {fmt: struct.Struct(fmt) for fmt in ("<B", "<H", "<i", "<I", "<Q", ">d")}
