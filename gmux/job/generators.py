"""A script's own random generators, attached beside its model (`attach(model, opt, gen)`): a torch.Generator,
a NumPy Generator or RandomState, a Python random.Random. The process-wide streams are always captured
(state.py's capture_rng); these are objects the script holds, which a new process would otherwise build afresh
from their seed, so that a moved job drew different augmentations or samples from then on than one never moved.

Each is captured as {"kind", "state"} in values the checkpoint format stores (a NumPy Generator's state as JSON
text: its PCG64 words exceed 64 bits), checked against the live generator without touching it, and put back
in place, so the script's references stay the ones it uses. `random_states` tries the process-wide streams a
framework keeps in the job's free-form state the same way."""
from __future__ import annotations

import json
import random
from typing import Optional

import numpy as np
import torch

from .checkpoint_error import CheckpointError

MT_WORDS = 624
KINDS = {"torch": torch.Generator, "numpy": np.random.Generator, "numpy_legacy": np.random.RandomState,
         "python": random.Random}


def is_generator(obj) -> bool:
    return isinstance(obj, tuple(KINDS.values()))


def kind_of(g) -> str:
    return next(k for k, cls in KINDS.items() if isinstance(g, cls))


def legacy_words(state: tuple) -> tuple:
    """A NumPy RandomState's state (MT19937) as the checkpoint stores it: its key words as an int64 tensor."""
    name, keys, *rest = state
    return (name, torch.from_numpy(keys.astype(np.int64)), *rest)


def legacy_state(saved: tuple) -> tuple:
    """`legacy_words` back to what RandomState.set_state takes; ValueError for words that are not uint32, or a
    position that is not in the key (`mt19937_bounds`)."""
    name, keys, pos, *rest = saved
    keys = keys.numpy()
    if keys.size and (keys.min() < 0 or keys.max() >= 1 << 32):
        raise ValueError("key words outside 0..2**32-1")
    mt19937_bounds(keys, pos)
    return (name, keys.astype(np.uint32), pos, *rest)


def mt19937_bounds(keys, pos) -> None:
    """NumPy takes any position into an MT19937 key and reads that far past its 624 words at the next draw: a
    checkpoint saying 1000000 crashed the job that restored it (SIGSEGV), a negative one read before the key."""
    if len(keys) != MT_WORDS:
        raise ValueError(f"{len(keys)} key words, not {MT_WORDS}")
    mt19937_position(pos)


def mt19937_position(pos) -> None:
    if type(pos) is not int or not 0 <= pos <= MT_WORDS:
        raise ValueError(f"position {pos!r} is not in 0..{MT_WORDS}")


def _bit_generator_bounds(state) -> None:
    """The positions NumPy's bit generators take unchecked, checked (`mt19937_bounds`; Philox's buffer)."""
    if not isinstance(state, dict):
        raise TypeError(f"{type(state).__name__}, not a bit generator's state")
    if state.get("bit_generator") == "MT19937" and isinstance(state.get("state"), dict):
        mt19937_bounds(state["state"].get("key", ()), state["state"].get("pos"))
    if state.get("bit_generator") == "Philox" and not (type(state.get("buffer_pos")) is int
                                                       and 0 <= state["buffer_pos"] <= 4):
        raise ValueError(f"buffer position {state.get('buffer_pos')!r} is not in 0..4")


def capture(g) -> dict:
    kind = kind_of(g)
    if kind == "torch":
        state = g.get_state()
    elif kind == "numpy":
        state = json.dumps(g.bit_generator.state, default=_plain)
    elif kind == "numpy_legacy":
        state = legacy_words(g.get_state())
    else:
        state = g.getstate()
    return {"kind": kind, "state": state}


def problem(saved, g) -> Optional[str]:
    """Why `saved` cannot be put into the live generator `g` (tried on a scratch one of its kind), or None."""
    if not (isinstance(saved, dict) and set(saved) == {"kind", "state"}):
        return "not a {kind, state} record"
    kind = kind_of(g)
    if saved["kind"] != kind:
        return f"a {saved['kind']} generator, the job attached a {kind} one"
    try:
        _put(_scratch(g), kind, saved["state"], g)
    except Exception as e:      # whatever a crafted state makes the generator's own setter raise (deep JSON too)
        return f"not a state of its {kind} generator ({str(e).splitlines()[0] if str(e) else type(e).__name__})"
    return None


BIT_GENERATORS = ("PCG64", "PCG64DXSM", "MT19937", "Philox", "SFC64")     # NumPy's own, made by name


def new(kind: str, state, device: str = "cpu"):
    """A generator of `kind` (on `device`, a torch one) that `state` can be put into, where the script's object
    holds none (a callback makes its own in a hook the restore has not run yet); ValueError where none can be made
    (a bit generator NumPy does not have, a CUDA one without CUDA)."""
    try:
        if kind == "torch":
            return torch.Generator(device=device)
        if kind == "numpy":
            name = json.loads(state).get("bit_generator") if isinstance(state, str) else None
            if name not in BIT_GENERATORS:
                raise ValueError(f"a bit generator {str(name)[:40]!r}")
            return np.random.Generator(getattr(np.random, name)())
        return {"numpy_legacy": np.random.RandomState, "python": random.Random}[kind]()
    except (RuntimeError, ValueError, TypeError, AttributeError, KeyError, RecursionError) as e:
        raise ValueError(f"no {kind} generator can take it ({str(e).splitlines()[0] if str(e) else e!r})") from None


def apply(g, saved: dict) -> None:
    """Only for a record `problem` has passed."""
    _put(g, saved["kind"], saved["state"], g)


def _put(target, kind: str, state, like) -> None:
    if kind == "torch":
        target.set_state(state)
    elif kind == "numpy":
        if not isinstance(state, str):
            raise TypeError(f"{type(state).__name__}, not JSON text")
        state = _arrays(json.loads(state), like.bit_generator.state)
        _bit_generator_bounds(state)
        target.bit_generator.state = state
    elif kind == "numpy_legacy":
        target.set_state(legacy_state(state))
    else:
        target.setstate(state)


def _scratch(g):
    if isinstance(g, torch.Generator):
        return torch.Generator(device=g.device)
    if isinstance(g, np.random.Generator):
        return np.random.Generator(type(g.bit_generator)())
    return type(g)()


def _plain(v):
    if isinstance(v, np.ndarray):
        return v.tolist()
    if isinstance(v, np.integer):
        return int(v)
    raise TypeError(f"{type(v).__name__} in a generator state")


def _arrays(saved, live):
    """The JSON state with arrays again where the live state has them (MT19937's key, SFC64's words...)."""
    if isinstance(live, np.ndarray):
        return np.asarray(saved, dtype=live.dtype)
    if isinstance(live, dict) and isinstance(saved, dict):
        return {k: _arrays(v, live.get(k)) for k, v in saved.items()}
    return saved


def random_states(rng, origin: str, where: str) -> dict:
    """`rng` if it is random states as `capture_rng` takes them (each tried on a scratch generator), or
    CheckpointError naming `where`: for states a framework keeps in the job's free-form `state`."""
    try:
        random.Random().setstate(rng["python"])
        np.random.RandomState().set_state(legacy_state(rng["numpy"]))
        torch.Generator().set_state(rng["torch"])
        if not isinstance(rng["cuda"], list) or not all(isinstance(s, torch.Tensor) and s.dtype == torch.uint8
                                                        for s in rng["cuda"]):
            raise TypeError("'cuda' is not a list of uint8 tensors")
    except (KeyError, IndexError, AttributeError, TypeError, ValueError, RuntimeError, OverflowError) as e:
        raise CheckpointError(origin, f"{where}: not the random states of a job ({str(e).splitlines()[0]})")
    return rng
