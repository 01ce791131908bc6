"""A script's own NumPy generators are checked on restore for the positions NumPy takes without a check: an
MT19937 position past its 624-word key made the next draw read that far past it (SIGSEGV at 1,000,000)."""
import json

import numpy as np
import pytest
import torch

from gmux.job import generators as gens


def _with(g, change):
    saved = gens.capture(g)
    state = json.loads(saved["state"])
    change(state)
    return {"kind": saved["kind"], "state": json.dumps(state)}


@pytest.mark.parametrize("pos", [625, 1_000_000, -1])
def test_a_numpy_mt19937_position_outside_its_key_is_refused(pos):
    g = np.random.Generator(np.random.MT19937(1))
    bad = _with(g, lambda s: s["state"].__setitem__("pos", pos))
    assert gens.problem(bad, g) == f"not a state of its numpy generator (position {pos} is not in 0..624)"
    assert gens.problem(_with(g, lambda s: s["state"].__setitem__("pos", 624)), g) is None


def test_a_philox_buffer_position_outside_its_buffer_is_refused():
    g = np.random.Generator(np.random.Philox(1))
    bad = _with(g, lambda s: s.__setitem__("buffer_pos", 100))
    assert "buffer position 100 is not in 0..4" in gens.problem(bad, g)


def test_a_legacy_random_state_position_outside_its_key_is_refused():
    g = np.random.RandomState(1)
    name, keys, _, *rest = gens.capture(g)["state"]
    with pytest.raises(ValueError, match="position 1000000 is not in 0..624"):
        gens.legacy_state((name, keys, 1_000_000, *rest))
    with pytest.raises(ValueError, match="3 key words, not 624"):
        gens.legacy_state((name, torch.zeros(3, dtype=torch.int64), 0, *rest))
    assert gens.problem({"kind": "numpy_legacy", "state": (name, keys, 5, *rest)}, g) is None
