"""Fuzz test of restore (issue 12): a real checkpoint (3 linear layers, Adam with state, StepLR, GradScaler,
extras, state=, a mid-epoch data position), mutated, restored into a live job of the same shape.

Every mutation here either changes nothing meaningful or makes the file wrong: bytes flipped (every byte is
under a checksum, the magic or the version), the stream truncated, frames duplicated, dropped or reordered;
the tensor table's rows given other dtypes, shapes (huge ones too) or sizes; skeleton values replaced by
values of another kind, keys removed or added, TensorRefs pointed elsewhere; values replaced by deep nesting
or shared-reference bombs; the END frame's counts changed. (Mutations that make another valid checkpoint,
such as another number in state= or a gradient left out, are not generated: a restore of those is right.)

The property: the restore either leaves the job exactly in the checkpoint's state, or raises CheckpointError
naming the file and leaves the job bit-identical to before the attempt. Any other exception fails.

Default: 100 examples (about 10-20 s here). GMUX_FUZZ_EXAMPLES=5000 for a longer run.
"""
import os
import pickle
import time

import msgpack
import pytest
from hypothesis import HealthCheck, event, given, settings, strategies as st

import gmux.job as gj
from gmux.job.checkpoint import DATA, END, HEAD, SKEL, TensorRef
from gmux_testkit import assert_identical, fuzz_examples

import ckpt_forge as forge
from test_restore_validation import frozen, small_job

EXAMPLES = fuzz_examples(100)
_ORIGINAL = {}


def original():
    """The checkpoint and the state it holds, made once per process."""
    if not _ORIGINAL:
        job = small_job(seed=0, steps=3)
        data = forge.written(job.snapshot())
        expect = frozen(job)
        expect["position"]["replay"] = True      # a restored mid-epoch position replays its batches
        _ORIGINAL.update(data=data, expect=expect, frames=forge.split(data), skeleton=forge.skeleton_of(data))
    return _ORIGINAL


# -- where a skeleton value may be changed -----------------------------------------------------------------
def nodes(obj, path=()):
    """(path, value) of every value under `obj`, in a fixed order."""
    yield path, obj
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from nodes(v, path + (k,))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from nodes(v, path + (i,))


def free(path) -> bool:
    """Values the job takes as they come (state=): changing them makes another valid checkpoint."""
    return len(path) >= 1 and path[0] == "state"


def optional_key(path) -> bool:
    """Dict entries a valid checkpoint may lack: a gradient, a parameter's optimizer state."""
    return (len(path) == 3 and path[0] == "grads") or (len(path) == 4 and path[0] == "optimizers"
                                                       and path[2] == "state")


def wrong_kinds(value, table_len: int) -> list:
    if isinstance(value, TensorRef):
        return [None, 5, "x", TensorRef(table_len + 3), TensorRef(-1), TensorRef("x"),
                TensorRef((value.index + 1) % table_len)]
    if value is None:
        return ["x", [], {}, b"x"]
    if isinstance(value, (bool, int, float)):
        return [None, "x", [], b"x"]
    if isinstance(value, str):
        return [None, 5, [], b"x"]
    if isinstance(value, list):
        return [None, 5, "x", {}, tuple(value)]
    if isinstance(value, tuple):
        return [None, 5, "x", {}, list(value)]
    if isinstance(value, dict):
        return [None, 5, "x", [], list(value.items())]
    return [None, 5]


def _set(root, path, value):
    if not path:
        return value
    parent = _get(root, path[:-1])
    if isinstance(parent, tuple):
        items = list(parent)
        items[path[-1]] = value
        return _set(root, path[:-1], tuple(items))
    parent[path[-1]] = value
    return root


def _get(root, path):
    for k in path:
        root = root[k]
    return root


def _copy(obj):
    if isinstance(obj, dict):
        return type(obj)((k, _copy(v)) for k, v in obj.items())
    if isinstance(obj, list):
        return [_copy(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_copy(v) for v in obj)
    return obj


@st.composite
def skeleton_mutation(draw, table_len: int):
    skel = _copy(original()["skeleton"])
    everything = list(nodes(skel))
    action = draw(st.sampled_from(["replace", "delete", "add", "bomb", "deep", "deep_key"]))
    event(f"skeleton: {action}")
    if action in ("bomb", "deep", "deep_key"):
        path, _ = draw(st.sampled_from(everything[1:]))
        if action == "bomb":
            raw = forge.shared_reference_bomb(draw(st.integers(7, 12)), draw(st.integers(8, 16)))
        elif action == "deep":
            raw = forge.deep_list(draw(st.integers(101, 20000)))
        else:   # a deep tuple as the key of a one-entry dict
            raw = b"}" + forge.deep_tuple(draw(st.integers(101, 20000))) + b"N" + b"s"
        return forge.spliced(_set(skel, path, forge.SENTINEL), raw)
    if action == "replace":
        path, value = draw(st.sampled_from([(p, v) for p, v in everything[1:] if not free(p)]))
        skel = _set(skel, path, draw(st.sampled_from(wrong_kinds(value, table_len))))
    elif action == "delete":
        keys = [(p, v) for p, v in everything[1:] if not free(p) and not optional_key(p)]
        path, _ = draw(st.sampled_from(keys))
        parent = _get(skel, path[:-1])
        if isinstance(parent, dict):
            del parent[path[-1]]
        else:
            items = list(parent)
            del items[path[-1]]
            skel = _set(skel, path[:-1], type(parent)(items))
    else:
        dicts = [(p, v) for p, v in everything if isinstance(v, dict) and not free(p) and p != ("state",)]
        path, target = draw(st.sampled_from(dicts))
        target["zz_junk"] = draw(st.sampled_from([1, None, "x", TensorRef(0)]))
    return pickle.dumps(skel, protocol=5)


@st.composite
def table_mutation(draw, rows: list):
    rows = [list(r) for r in rows]
    i = draw(st.integers(0, len(rows) - 1))
    dtype, shape, nbytes = rows[i]
    how = draw(st.sampled_from(["dtype", "shape", "huge", "nbytes", "junk", "drop", "extra"]))
    event(f"table: {how}")
    if how == "dtype":
        new = draw(st.sampled_from([d for d in ("float64", "float16", "int32", "uint8", "bool") if d != dtype]))
        size = {"float64": 8, "float16": 2, "int32": 4, "uint8": 1, "bool": 1}[new]
        rows[i] = [new, shape, nbytes // {"float32": 4, "uint8": 1, "int64": 8}[dtype] * size]
    elif how == "shape":
        new = draw(st.lists(st.integers(0, 9), max_size=4).filter(lambda s: s != shape))
        count = 1
        for d in new:
            count *= d
        rows[i] = [dtype, new, count * {"float32": 4, "uint8": 1, "int64": 8}[dtype]]
    elif how == "huge":
        n = draw(st.sampled_from([1 << 31, 1 << 40, 1 << 62]))
        rows[i] = ["uint8", [n], n]
    elif how == "nbytes":
        rows[i] = [dtype, shape, draw(st.integers(0, (1 << 64) - 1).filter(lambda n: n != nbytes))]
    elif how == "junk":
        rows[i] = draw(st.sampled_from([None, "x", [dtype, shape], [dtype, "shape", nbytes], [1, shape, nbytes]]))
    elif how == "drop":
        del rows[i]
    else:
        rows.insert(i, ["float32", [3], 12])
    return msgpack.packb({"tensors": rows})


@st.composite
def mutated(draw):
    """A mutated copy of the original checkpoint's bytes."""
    frames = [list(f) for f in original()["frames"]]
    rows = forge.table_of(original()["data"])
    # The skeleton and the table are where the validation is: half the examples change the skeleton.
    kind = draw(st.sampled_from(["flip", "truncate", "duplicate", "move", "drop", "head", "head", "end"]
                                + ["skel"] * 8))
    event(f"mutation: {kind}")
    if kind in ("flip", "truncate"):
        data = bytearray(original()["data"])
        at = draw(st.integers(0, len(data) - 1))
        if kind == "truncate":
            return bytes(data[:at])
        data[at] ^= draw(st.integers(1, 255))
        return bytes(data)
    i = draw(st.integers(0, len(frames) - 1))
    if kind == "duplicate":
        frames.insert(draw(st.integers(0, len(frames))), list(frames[i]))
    elif kind == "move":
        f = frames.pop(i)
        j = draw(st.integers(0, len(frames) - 1))
        frames.insert(j if j < i else j + 1, f)      # anywhere but where it was
    elif kind == "drop":
        del frames[i]
    elif kind == "head":
        frames[0][1] = draw(table_mutation(rows))
    elif kind == "skel":
        frames[1][1] = draw(skeleton_mutation(len(rows)))
    else:
        end = msgpack.unpackb(frames[-1][1])
        key = draw(st.sampled_from(sorted(end)))
        end[key] = draw(st.sampled_from([None, "x", -1, end[key] + 1, end[key] - 1, (1 << 64) - 1]))
        frames[-1][1] = msgpack.packb(end)
    return forge.join(frames)


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return str(tmp_path_factory.mktemp("fuzz") / "c.ckpt")


def test_the_fuzzer_starts_from_a_checkpoint_that_restores(path):
    with open(path, "wb") as f:
        f.write(original()["data"])
    job = small_job(seed=1, steps=2)
    job.restore(path)
    assert_identical(original()["expect"], frozen(job))
    kinds = [k for k, _ in original()["frames"]]
    assert kinds[:2] == [HEAD, SKEL] and kinds[-1] == END and set(kinds[2:-1]) == {DATA}


@settings(max_examples=EXAMPLES, deadline=None, derandomize=EXAMPLES <= 100, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=mutated())
def test_a_mutated_checkpoint_is_restored_exactly_or_refused_changing_nothing(path, data):
    with open(path, "wb") as f:
        f.write(data)
    job = small_job(seed=1, steps=2)
    before = frozen(job)
    t0 = time.perf_counter()
    try:
        job.restore(path)
    except gj.CheckpointError as e:
        event("outcome: refused")
        assert repr(path) in str(e), f"the refusal does not name the file: {e}"
        assert_identical(before, frozen(job), "the job after a refused restore")
    else:
        event("outcome: restored")
        assert_identical(original()["expect"], frozen(job), "the job after a restore")
    assert time.perf_counter() - t0 < 5, "a restore attempt took more than 5 s"
