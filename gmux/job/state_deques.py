"""Deques among state='s values (a replay buffer of transitions, a window of the last losses), in a form a
checkpoint holds and back: its items and its maxlen, tagged as gmux.job.tagged_values tags a module attribute's
deque. A checkpoint refused them by type, and a move of an RL loop keeping its replay buffer in state= was refused
where it would have been exact."""
from __future__ import annotations

import collections

from . import tagged_values
from .tagged_values import DEQUE

_DEPTH = 8          # (as deep as a checkpoint keeps state='s tensors: gmux.job.state.tensors_inside)


def stored(value, depth: int = 0):
    """`value` with each deque inside its lists, tuples and dicts tagged (the others as they are, not copied)."""
    if type(value) is collections.deque:
        return {DEQUE: value.maxlen, "items": [stored(v, depth + 1) for v in value]}
    if depth > _DEPTH or not _holds_deque(value, depth):
        return value
    if type(value) is dict:
        return {k: stored(v, depth + 1) for k, v in value.items()}
    return type(value)(stored(v, depth + 1) for v in value)


def _holds_deque(value, depth: int) -> bool:
    if type(value) is collections.deque:
        return True
    if depth > _DEPTH or type(value) not in (list, tuple, dict):
        return False
    return any(_holds_deque(v, depth + 1) for v in (value.values() if type(value) is dict else value))


def loaded(value):
    """`stored`'s value (from a file) with each tagged deque made again; a tag that is not a deque's
    (tagged_values.fits: items not a list, more of them than its maxlen, a maxlen no deque takes) stays the dict the
    file holds, so that a restore cannot fail half-way on it."""
    if type(value) is dict:
        if tagged_values.tagged(value) == DEQUE and tagged_values.fits(value, lambda _: True):
            return tagged_values.decode(value, loaded)
        return {k: loaded(v) for k, v in value.items()}
    if type(value) in (list, tuple):
        return type(value)(map(loaded, value))
    return value
