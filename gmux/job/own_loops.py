"""The script's own `for` loop around a pass over job.data read to its end outside job.epochs: a new process runs the
script from its start, so such a loop (`for epoch in range(10):`) begins again from its first iteration and trains
the passes before the move once more. A `while` loop by steps whose count is kept in state= goes on as it was, and
nothing needs saying; neither can be seen from the data, only from the script's source around the frames that read
it, so that is where this looks: once per line of each frame, the answers kept."""
from __future__ import annotations

import ast
import linecache
import os
from types import FrameType
from typing import Iterator, Optional

_GMUX = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_UNKNOWN = ""          # a frame whose source cannot be read: a loop may be there, unseen
_trees: dict = {}      # file -> (its lines, its parsed tree, or None)
_answers: dict = {}    # (file, line, loops from line, innermost) -> the restarting loop there, _UNKNOWN or None


def gmux_file(path: str) -> bool:
    """Whether `path` is gmux's own code (a frame or thread running it is not the script's)."""
    return os.path.abspath(path).startswith(_GMUX + os.sep)


def restarting_loop(frame: Optional[FrameType], attached_at=None) -> Optional[str]:
    """The innermost `for` loop of the script's around the frame reading job.data (`frame`, and the frames that
    called it up to the script's top level, or to the one that attached the job: `attached_at`, its (code, line),
    where only loops begun after the attach count), as "`for epoch in range(10):` at train.py:42"; "" where a
    frame's source could not be read and none was found; None where none is there (while loops only)."""
    try:
        return _restarting_loop(frame, attached_at)
    except Exception:       # (a warning's guess: whatever a source holds, the script trains on, warned unseen)
        return _UNKNOWN


def script_frames(frame: Optional[FrameType], attached_at, past=()) -> Iterator[tuple[FrameType, int]]:
    """The script's frames from `frame` up, each with the line after which its loops are the job's (the attach's
    line in the frame that attached the job, `attached_at` (code, line); else 0), to that frame or the script's top
    level. gmux's own frames are passed over, and those of files under the directories in `past`."""
    while frame is not None:
        code = frame.f_code
        path = code.co_filename
        if path.startswith("<frozen") or path.startswith(past) or gmux_file(path):
            frame = frame.f_back
            continue
        attach_here = attached_at is not None and attached_at[0] is code
        yield frame, attached_at[1] if attach_here else 0
        if attach_here or (code.co_name == "<module>" and frame.f_globals.get("__name__") == "__main__"):
            return
        frame = frame.f_back


def _restarting_loop(frame: Optional[FrameType], attached_at) -> Optional[str]:
    unknown = False
    for i, (f, after) in enumerate(script_frames(frame, attached_at)):
        found = _loop_in(f.f_code.co_filename, f.f_lineno or 0, after, i == 0, f.f_globals)
        if found:
            return found
        unknown = unknown or found == _UNKNOWN
    return _UNKNOWN if unknown else None


def _loop_in(path: str, line: int, after: int, innermost: bool, module_globals) -> Optional[str]:
    key = (path, line, after, innermost)
    if key not in _answers:
        _answers[key] = _find(path, line, after, innermost, module_globals)
    return _answers[key]


def source(path: str, module_globals) -> tuple[list, Optional[ast.Module]]:
    """The lines of a script's file and its parsed tree (None where it cannot be read or parsed), read once."""
    if path not in _trees:
        lines = linecache.getlines(path, module_globals)
        try:
            _trees[path] = (lines, ast.parse("".join(lines)) if lines else None)
        except (SyntaxError, ValueError, RecursionError, MemoryError):      # (changed on disk since it ran)
            _trees[path] = (lines, None)
    return _trees[path]


def _find(path: str, line: int, after: int, innermost: bool, module_globals) -> Optional[str]:
    lines, tree = source(path, module_globals)
    if tree is None:
        return _UNKNOWN
    loops = [n for n in ast.walk(tree) if isinstance(n, (ast.For, ast.AsyncFor)) and n.lineno > after and
             n.body[0].lineno <= line <= n.end_lineno and not (innermost and n.lineno == line)]
    # (the frame reading job.data stands on its own loop's header, which is not around it)
    if not loops:
        return None
    loop = max(loops, key=lambda n: n.lineno)
    header = lines[loop.lineno - 1].strip() if loop.lineno <= len(lines) else "for ..."
    return f"`{header[:100]}` at {os.path.basename(path)}:{loop.lineno}"
