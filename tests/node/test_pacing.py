"""The deadline and turn arithmetic (gmux.node.pacing): pure, no clock."""
import math

import pytest

from gmux.node.pacing import Pacing


def test_deadline_is_k_mini_batches_but_never_under_the_floor():
    p = Pacing(floor=1.0, k=3.0, c=2.0)
    assert p.deadline(None) == 1.0            # nothing measured yet: the floor
    assert p.deadline(0.01) == 1.0            # short mini-batches: the floor covers the suspend's copy
    assert p.deadline(2.0) == 6.0             # long ones: room for an ordinary slow mini-batch
    assert p.deadline(float("nan")) == 1.0 and p.deadline(0.0) == 1.0 and p.deadline(-5.0) == 1.0


def test_turn_stretches_for_a_mini_batch_longer_than_the_quantum():
    p = Pacing(floor=1.0, k=3.0, c=2.0)
    assert p.turn(0.5, None) == 0.5
    assert p.turn(0.5, 0.1) == 0.5            # many mini-batches per quantum: the quantum
    assert p.turn(0.5, 3.0) == 6.0            # c mini-batches per turn, not one suspend per step
    assert p.turn(60.0, 3.0) == 60.0
    assert p.turn(1.0, math.inf) == 1.0       # a nonsense figure changes nothing


@pytest.mark.parametrize("bad", [dict(floor=0), dict(k=0.5), dict(c=0.9)])
def test_nonsense_pacing_is_refused(bad):
    with pytest.raises(ValueError):
        Pacing(**bad)
