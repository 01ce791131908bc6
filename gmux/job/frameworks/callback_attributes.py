"""What the script's own Trainer callbacks changed in their attributes, carried to the process a move continues the
run in (Hugging Face and Lightning).

The new process builds the script's callbacks again, with the same arguments; what one changed since (the steps
since it last acted, a best value so far, a flag that it has unfrozen the backbone) neither framework's resume
puts back, unless the callback keeps a state of its own (Lightning's state_dict(), Hugging Face's ExportableState),
which its framework restores. A moved run's callback started from its constructor's values, and acted otherwise
than unmoved. gmux keeps the attributes of each such callback that hold plain data (None, booleans, numbers,
strings, and lists, tuples and dicts of them) and puts them back once the framework's hooks that set a callback
up for the run have run again in the new process. Tensors are carried too, alone or inside such containers (a best
value taken from the trainer's metrics, `self.best = min(self.best, metrics["val_loss"])`), and put back on the
model's device (those the script kept on the host stay there), and NumPy values, deques, defaultdicts, Counters,
OrderedDicts and random generators, as they were (gmux.job.tagged_values). An attribute holding another object (a
file, the trainer) is rebuilt by the callback as it is built now; one holding numbers gmux does not carry (a set, a
tensor of the step's graph) that changed keeps the job where it is (`not_carried`): the callback's counts would
start again. Read from a checkpoint file, each value is checked first: plain, within bounds, and of the kind the new
callback holds under its name (if it holds plain data there).
"""
from __future__ import annotations

from typing import Callable, Optional

from gmux.job import plain_values

FRAMEWORKS = ("transformers.", "lightning.", "pytorch_lightning.", "gmux.")


def own(callbacks: list, keeps_its_own: Callable) -> dict:
    """The script's callbacks that keep no state of their own, by their place among them and their class."""
    mine = [cb for cb in callbacks if not type(cb).__module__.startswith(FRAMEWORKS) and not keeps_its_own(cb)]
    return {f"{i}:{type(cb).__qualname__}": cb for i, cb in enumerate(mine)}


def remember(callbacks: dict) -> None:
    """As the Trainer starts: what each callback holds, which capture() carries the changes of."""
    for cb in callbacks.values():
        plain_values.remember(cb)


def capture(callbacks: dict) -> dict:
    """{callback: {attribute: value}} of the attributes that hold plain data (tensors, NumPy values and deques
    among it) and changed since the Trainer started (gmux.job.plain_values: a callback carried whole or not at all)."""
    return {key: plain_values.with_places(plain_values.changed(cb)) for key, cb in callbacks.items()}


def not_carried(callbacks: dict) -> Optional[str]:
    """Why a move would lose what a callback counted (None: it would not): one holds numbers that changed in a
    value gmux does not carry (a set, a NumPy string, a tensor of the step's graph), and is left out whole
    (`capture`), or one changed its kind, which a restore refuses (plain_values.kind_changed). Other objects that
    changed (a writer, a file) are made again by the new process's callback, as before gmux carried any."""
    for key, cb in callbacks.items():
        found = plain_values.unkept_numbers(cb)
        if found is not None:
            return (f"its callback {type(cb).__name__}'s attribute {found} changed as it trained, and gmux carries "
                    f"only plain data (numbers, strings, tensors, NumPy numbers, lists, dicts, deques, str or int "
                    f"keys): a new process would start the callback anew (hold a list: list(s))")
        kind = plain_values.kind_changed(cb)
        if kind is not None:
            return (f"its callback {type(cb).__name__}'s attribute {kind}: a new "
                    f"process builds the callback as the script does, and its restore would not put the other kind "
                    f"there (keep one kind in it, or None until it is set)")
        # (unlike a module's, which its next forward makes again, a callback's is read by the callback only)
        graph = plain_values.graph_beside(cb, alone=True)
        if graph is not None:
            return (f"its callback {type(cb).__name__}'s attribute {graph} holds a tensor of the step's graph, which "
                    f"a checkpoint does not carry: a new process would start the callback anew (keep it detached: "
                    f".detach())")
    return None


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
        why = plain_values.fits_placed(callbacks[key], values)
        if why is not None:
            raise CheckpointError(path, f"state 'callback_attributes' of the script's callback "
                                        f"{type(callbacks[key]).__name__}: {why}")
    return saved


def put_back(callbacks: dict, checked: Optional[dict], device) -> None:
    """Only what check() returned: all of it was checked, so nothing is set half-way. Tensors go to `device` (the
    model's), but those the script kept on the host."""
    for key, values in (checked or {}).items():
        for name, value in plain_values.placed(values, device).items():
            plain_values.put(callbacks[key], name, value)
