"""The error a refused checkpoint raises, in a module of its own: the modules gmux.job.checkpoint itself imports
(the parts of the format it leaves to them) raise it too, which they could not import from there without a cycle."""
from __future__ import annotations

from typing import Optional


class CheckpointError(ValueError):
    """A checkpoint refused: `origin` names the file (or stream), `problem` the field and what is wrong."""
    def __init__(self, origin: str, problem: Optional[str] = None):
        if problem is None:             # one-argument form: a message that names the file itself
            origin, problem = None, origin
        super().__init__(problem if origin is None else f"checkpoint {origin}: {problem}")
        self.origin, self.problem = origin, problem
