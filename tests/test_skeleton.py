"""The skeleton decoder: reads what gmux writes exactly as pickle does, and refuses, while decoding and with
bounded memory, whatever costs more than a skeleton could (gmux/job/skeleton.py)."""
import collections
import os
import pickle
import struct
import time

import pytest
import torch

from gmux.job import checkpoint as ckpt
from gmux.job import skeleton
from gmux.job.skeleton import MAX_DEPTH, SkeletonError
from gmux.job.sparse_tensors import SparseRef

import ckpt_forge as forge

VALUES = {
    "leaves": [0, 255, 65535, -1, 2 ** 31, 2 ** 70, -2 ** 70, 1.5, float("inf"), True, False, None, "ü€\U0001f600",
               "x" * 300, b"\x00b", b"y" * 300, bytearray(b"z"), complex(1, -2)],
    "tuples": (1, (2, (3,)), (), (1, 2, 3, 4)),
    "sets": [{1, "x", (1, 2)}, frozenset({3}), set(), frozenset()],
    "ordered": collections.OrderedDict(b=1, a=2),
    "counted": collections.Counter({30: 1, 60: 2}),       # (MultiStepLR's milestones)
    "refs": [ckpt.TensorRef(0), ckpt.TensorRef(1)],
    "sparse": [SparseRef("sparse_coo", (4, 3), False, ckpt.TensorRef(2), ckpt.TensorRef(3))],
    "long": list(range(2500)),               # more than one APPENDS batch of 1000
    "map": {i: str(i) for i in range(2500)},
    "shared": ["same string"] * 10,
}


def decode(data: bytes, budget=None):
    return skeleton.decode(data, (ckpt._make_ref, ckpt._make_sparse), ckpt._ALLOWED, budget)


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_decodes_what_gmux_writes_as_pickle_does(protocol):
    values = VALUES
    if protocol == 2:      # bytes, complex and sets go by Python 2 names there; gmux writes 5, the tests' forge 2
        values = {**VALUES, "leaves": [v for v in VALUES["leaves"] if not isinstance(v, (bytes, bytearray, complex))],
                  "sets": []}
    data = pickle.dumps(values, protocol=protocol)
    got = decode(data)
    assert got == pickle.loads(data)
    assert type(got["ordered"]) is collections.OrderedDict and list(got["ordered"]) == ["b", "a"]
    assert type(got["counted"]) is collections.Counter and sorted(got["counted"].elements()) == [30, 60, 60]
    if protocol > 2:
        assert type(got["leaves"][16]) is bytearray and type(got["sets"][1]) is frozenset


def test_a_real_snapshot_decodes_as_pickle_does():
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(4, 3)).sum().backward()
    opt.step()
    tensors = []
    skel = ckpt._split({"modules": [model.state_dict()], "optimizers": [opt.state_dict()]}, tensors, [], [])
    data = pickle.dumps(skel, protocol=5)
    assert decode(data) == pickle.loads(data)


@pytest.mark.parametrize("value, name", [
    (os.system, "posix.system"), (object(), "builtins.object"), (torch.zeros(1), "torch._utils"),
    (collections.deque(), "collections.deque")])
def test_only_the_allowed_classes_are_built(value, name):
    with pytest.raises(SkeletonError, match=f"a value of type {name}"):
        decode(pickle.dumps(value, protocol=5))


def test_a_tensor_reference_needs_an_integer_index():
    for bad in ("x", None, 1.5, True):
        with pytest.raises(SkeletonError, match="without an integer index"):
            decode(pickle.dumps(ckpt.TensorRef(bad), protocol=5))


def test_only_a_builder_is_made_by_NEWOBJ_and_BUILD_and_once():
    """NEWOBJ then BUILD make the builders' classes (a TensorRef; a SparseRef next to it), each from its fields, once;
    an allowed class that is built otherwise (an OrderedDict) is no builder, and a reference is not built twice."""
    with pytest.raises(SkeletonError, match="NEWOBJ at byte .* of OrderedDict"):
        decode(b"\x80\x02ccollections\nOrderedDict\n)\x81.")
    ref = pickle.dumps(ckpt.TensorRef(0), protocol=2)
    assert ref.endswith(b"b.") and decode(ref) == ckpt.TensorRef(0)
    with pytest.raises(SkeletonError, match="BUILD at byte"):
        decode(ref[:-1] + b"}b.")


def test_a_cycle_is_refused():
    # EMPTY_LIST, BINPUT 0, BINGET 0, APPEND: a list that contains itself (pickle.loads builds it)
    data = b"\x80\x02]q\x00h\x00a."
    looped = pickle.loads(data)
    assert looped[0] is looped
    with pytest.raises(SkeletonError, match="already referred to"):
        decode(data)


def test_lengths_are_checked_before_anything_is_allocated():
    for op in (b"\x8e", b"\x8d", b"\x96"):      # BINBYTES8, BINUNICODE8, BYTEARRAY8 claiming 1 TiB
        with pytest.raises(SkeletonError, match="truncated: 1099511627776 bytes claimed"):
            decode(b"\x80\x05" + op + struct.pack("<Q", 1 << 40) + b"abc.")


def test_nesting_deeper_than_the_bound_is_refused():
    assert decode(b"\x80\x02" + forge.deep_list(MAX_DEPTH + 1) + b".") is not None
    for raw in (forge.deep_list(MAX_DEPTH + 2), forge.deep_tuple(MAX_DEPTH + 1), forge.deep_list(10 ** 6)):
        with pytest.raises(SkeletonError, match=f"nested deeper than {MAX_DEPTH} levels"):
            decode(b"\x80\x02" + raw + b".")


def test_shared_references_are_refused_once_they_expand_past_the_budget():
    bomb = b"\x80\x02" + forge.shared_reference_bomb(levels=20, width=16) + b"."   # 16**20 values
    t0 = time.perf_counter()
    with pytest.raises(SkeletonError, match="shared references that expand to more than"):
        decode(bomb)
    assert time.perf_counter() - t0 < 1
    small = b"\x80\x02" + forge.shared_reference_bomb(levels=2, width=8) + b"."
    assert decode(small) == [[None] * 8] * 8        # sharing within the budget is fine


@pytest.mark.parametrize("raw, what", [
    (b"]" * 2000, "values waiting on the stack"), (b"N" + b"\x94" * 2000, "memo entries"),
    (b"(" * 2000, "marks"), (b"\x95" + bytes(8), "opcodes")])
def test_the_decoder_itself_holds_bounded_memory(raw, what):
    if what == "opcodes":
        raw = raw * 9000                        # FRAME opcodes: no value at all, only time
    with pytest.raises(SkeletonError, match=f"more than \\d+ {what}"):
        decode(b"\x80\x02" + raw + b".", budget=1000)


@pytest.mark.parametrize("data, what", [
    (b"\x80\x02N", "no STOP"), (b"\x80\x02NN.", "exactly one value"), (b"\x80\x02N.junk", "after the end"),
    (b"\x80\x02a.", "stack underflow"), (b"\x80\x02P.", "never writes"), (b"\x80\x02h\x07.", "memo slot 7"),
    (b"\x80\x02}]s.", "does not follow a new dict"), (b"\x80\x02)]a.", "does not follow a new list"),
    (b"\x80\x02ccollections\nCounter\n]\x85R.", "a Counter built from something other than a dict")])
def test_malformed_skeletons_are_refused_by_name(data, what):
    with pytest.raises(SkeletonError, match=what):
        decode(data)
