"""What the script's own Trainer callbacks changed in their attributes, carried to the process a move continues the
run in (Hugging Face and Lightning).

The new process builds the script's callbacks again, with the same arguments; what one changed since (the steps
since it last acted, a best value so far, a flag that it has unfrozen the backbone) neither framework's resume
puts back, unless the callback keeps a state of its own (Lightning's state_dict(), Hugging Face's ExportableState),
which its framework restores. A moved run's callback started from its constructor's values, and acted otherwise
than unmoved. gmux keeps the attributes of each such callback that hold plain data (None, booleans, numbers,
strings, and lists, tuples and dicts of them) and puts them back once the framework's hooks that set a callback
up for the run have run again in the new process. An attribute holding anything else (a tensor, a file, the
trainer) is rebuilt by the callback as it is built now. Read from a checkpoint file, each value is checked first:
plain, within bounds, and of the kind the new callback holds under its name (if it holds plain data there).
"""
from __future__ import annotations

from typing import Callable, Optional

MAX_ITEMS = 4096        # values in one callback's attributes, nested ones counted
MAX_TEXT = 4096         # characters in one string
MAX_DEPTH = 4
FRAMEWORKS = ("transformers.", "lightning.", "pytorch_lightning.", "gmux.")


def own(callbacks: list, keeps_its_own: Callable) -> dict:
    """The script's callbacks that keep no state of their own, by their place among them and their class."""
    mine = [cb for cb in callbacks if not type(cb).__module__.startswith(FRAMEWORKS) and not keeps_its_own(cb)]
    return {f"{i}:{type(cb).__qualname__}": cb for i, cb in enumerate(mine)}


def capture(callbacks: dict) -> dict:
    """{callback: {attribute: value}} of the attributes that hold plain data."""
    out = {}
    for key, cb in callbacks.items():
        kept, budget = {}, [MAX_ITEMS]
        for name, value in vars(cb).items():
            if isinstance(name, str) and _plain(value, budget, 0):
                kept[name] = value
        out[key] = kept
    return out


def check(callbacks: dict, saved, path: str) -> Optional[dict]:
    """What put_back() will set ({callback: {attribute: value}}), refused whole if any of it does not fit the
    new process's callbacks. None: a checkpoint written before gmux kept them."""
    if saved is None:
        return None
    from gmux.job.checkpoint import CheckpointError
    if not isinstance(saved, dict) or set(saved) != set(callbacks):
        found = sorted(map(str, saved))[:6] if isinstance(saved, dict) else f"a {type(saved).__name__}"
        raise CheckpointError(path, f"state 'callback_attributes': {found}, the script's own callbacks are "
                                    f"{sorted(callbacks)[:6]}")
    for key, values in saved.items():
        cb, where = callbacks[key], f"of the script's callback {type(callbacks[key]).__name__}"
        if not isinstance(values, dict):
            raise CheckpointError(path, f"state 'callback_attributes' {where}: a {type(values).__name__}, not a dict")
        for name, value in values.items():
            if not (isinstance(name, str) and _plain(value, [MAX_ITEMS], 0)
                    and _may_take(cb, name, value)):
                raise CheckpointError(path, f"state 'callback_attributes' {where}: {str(name)[:40]!r} is "
                                            f"{str(value)[:40]!r}, not plain data of the kind the callback holds")
    return saved


def put_back(callbacks: dict, checked: Optional[dict]) -> None:
    """Only what check() returned: all of it was checked, so nothing is set half-way."""
    for key, values in (checked or {}).items():
        for name, value in values.items():
            setattr(callbacks[key], name, value)


_NEW = object()


def _plain(value, budget: list, depth: int) -> bool:
    budget[0] -= 1
    if budget[0] < 0 or depth > MAX_DEPTH:
        return False
    if value is None or type(value) in (bool, int, float):
        return True
    if type(value) is str:
        return len(value) <= MAX_TEXT
    if type(value) in (list, tuple):
        return all(_plain(v, budget, depth + 1) for v in value)
    if type(value) is dict:
        return all(type(k) in (str, int) and _plain(v, budget, depth + 1) for k, v in value.items())
    return False


def _may_take(cb, name: str, value) -> bool:
    """Whether the new callback's attribute may take `value`: one it does not have yet (not a method or a special
    name), one holding None or what is not plain data (the moved process held `value` there), or one of its kind (a
    number for a number, bool apart; a list or tuple for either)."""
    now = vars(cb).get(name, _NEW)
    if now is _NEW:
        return not name.startswith("__") and not callable(getattr(type(cb), name, None))
    if now is None or value is None or not _plain(now, [MAX_ITEMS], 0):
        return True
    return _kind(now) == _kind(value)


def _kind(v):
    return bool if type(v) is bool else "number" if type(v) in (int, float) else list if type(v) is tuple else type(v)
