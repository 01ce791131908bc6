"""The script's own threads beside a suspend. A suspend takes the job's tensors off the device (their storages
emptied, or their memory handed back) at a boundary of the training loop's thread, and another thread of the script
reading them then (a logger taking a weight's norm, a background torch.save of the state_dict) crashes the process
or writes a broken file. gmux cannot stop a Python thread where it stands, so such a thread says where it reads them:
`with gmux.job.resident():` holds a suspend off until it ends, and waits while the job is suspended. The first
suspend of a process whose own threads run beside it, where none has used it, says so on stderr."""
from __future__ import annotations

import contextlib
import os
import sys
import sysconfig
import threading
from typing import Iterator, Optional

from gmux.util.text import printable

from .own_loops import gmux_file

_lock = threading.RLock()      # (reentrant: a suspend met inside the loop thread's own `resident()` goes on)
_used = False                  # a thread of the script's has said where it reads the tensors
_looked = False                # the first suspend looked for threads of the script's own
_LIBRARIES = {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib")}


@contextlib.contextmanager
def resident() -> Iterator[None]:
    """In a thread of the script's own, around what reads the job's tensors: no suspend begins while inside, and
    one under way is waited for."""
    global _used
    _used = True
    with _lock:
        yield


@contextlib.contextmanager
def suspending() -> Iterator[None]:
    """Around a suspend, from its first copy to its resume's last (Job._held_by_driver)."""
    global _looked
    if not _looked:
        _looked = True
        if not _used and (names := running()):
            print(f"gmux: the script runs threads of its own beside its training loop ({', '.join(names[:4])}): "
                  f"while the job is suspended its tensors are off the device, and a thread reading them then crashes "
                  f"the process or reads nothing (a torch.save of the state_dict writes a broken file); wrap what such "
                  f"a thread reads in `with gmux.job.resident():`, which holds a suspend off until it ends",
                  file=sys.stderr, flush=True)
    with _lock:
        yield


def running() -> list:
    """The names of the live threads, other than this one, that run the script's own code (not Python's, an
    installed library's or gmux's)."""
    me = threading.current_thread()
    return [printable(t.name, limit=40) for t in threading.enumerate()
            if t is not me and t.is_alive() and _is_scripts(_code_file(t))]


def _code_file(thread: threading.Thread) -> Optional[str]:
    run = type(thread).run
    fn = getattr(thread, "_target", None) if run is threading.Thread.run else run
    fn = getattr(fn, "func", fn)            # (a functools.partial)
    fn = getattr(fn, "__func__", fn)        # (a bound method)
    code = getattr(fn, "__code__", None)
    return code.co_filename if code is not None else None


def _is_scripts(path: Optional[str]) -> bool:
    if not path or path.startswith("<"):
        return False
    path = os.path.abspath(path)
    parts = path.split(os.sep)
    return not ("site-packages" in parts or "dist-packages" in parts or gmux_file(path) or
                any(path.startswith(lib + os.sep) for lib in _LIBRARIES))
