"""Runs a user's training script, unmodified, as a gmux job in this very process: what gmux-launch (launch.py,
driven by gmuxd's agent) and `python -m gmux.job.run` (run.py, driven locally) have in common.

In order: the job's device memory is set up before the script allocates anything (on a GPU its allocations
are routed through gmux: gmux.job.memory.device_memory); the transparent hook is installed, so that the
script's optimizer steps are the job's boundaries, and with it the watch for frameworks' Trainers
(gmux.job.frameworks), which take over from the hook when the script trains with one; the script runs as
`__main__` through runpy, in this process, so the hook sees its steps. However the script ends, the end
becomes one exit status and one reason.

Nothing here imports torch at module level: gmux-launch imports it at one chosen point (warm_up), so that its
usage errors and --help answer at once.
"""
from __future__ import annotations

import importlib
import os
import runpy
import sys
import traceback
from typing import Callable, Optional


def warm_up(script: Optional[str] = None) -> None:
    """Imports what running a script as a job needs (torch and the runtime: seconds on a busy machine). A
    launcher calls it before it registers: once registered, a job may be given the GPU at once, and a GPU
    handed to a job that is still importing torch is idle while the job it displaced could have trained (a job
    that re-executes after a spill or a move would cost the GPU that import at every turn)."""
    for module in ("hook", "memory.state_tier", "memory.allocator_tier"):
        importlib.import_module(f"{__package__}.{module}")
    from . import frameworks
    frameworks.warm_up(script)   # the framework `script` trains with, if any (transformers: seconds more)


def prepare(controller=None, *, hook: bool = True, pool_bytes: int = 0, native: bool = True,
            mem_limit: Optional[int] = None, job: Optional[str] = None, name: Optional[str] = None):
    """Sets up the job's device memory (a virtual GPU of `pool_bytes` on the CPU; `native`: allow gmux's
    native allocator; `mem_limit`: the job's --mem, past which its allocations fail, naming `job` and `name`)
    and, with `hook`, installs the transparent hook with `controller` driving the job.
    Returns the hook's Job; None without the hook (the script then attaches its state itself, with a pool of
    its own on the CPU, and on a GPU gets the allocator tier through the routing set up here)."""
    from .memory import device_memory

    pool = device_memory(pool_bytes, native, mem_limit, job=job, name=name)
    if not hook:
        return None
    from .hook import install_hook
    from . import frameworks
    hooked = install_hook(controller=controller, pool=pool)
    # A script that trains with Hugging Face's or Lightning's Trainer becomes an explicit-mode job once its
    # Trainer starts (gmux/job/frameworks): movable, where the framework's setup allows an exact resume.
    frameworks.install(hooked)
    return hooked


# What each script left (its namespace, or the exception it ended with, whose traceback holds its frames), kept
# until the interpreter ends, as python keeps a script's __main__. Freed the moment the script returned, a torch
# process group the script still held (its DDP model's) was destroyed while gloo's thread was still freeing the
# last collective's work: ~ProcessGroupGloo joins that thread holding the GIL, the thread waits for the GIL to
# release a Python object of that work, and the rank hung for ever after its work was done (3 runs in 50 on a
# busy machine, tests/test_ddp_hooks.py).
_LEFT_BY_SCRIPTS: list = []


def run_script(kind: str, target: str, argv: list, setup: Optional[Callable[[], None]] = None) -> tuple[int, str]:
    """Runs the script (`kind` 'path' or 'module', as gmux.util.job_command.script_of says) as `__main__`
    with sys.argv = `argv`, after `setup()`; returns (exit status, reason). A failure in `setup` ends the job
    like a failing script."""
    status, reason = 0, "finished"
    saved_argv = sys.argv
    try:
        if setup is not None:
            setup()
        sys.argv = list(argv)
        if kind == "module":
            _LEFT_BY_SCRIPTS.append(runpy.run_module(target, run_name="__main__", alter_sys=True))
        else:
            sys.path.insert(0, os.path.dirname(os.path.abspath(target)))
            _LEFT_BY_SCRIPTS.append(runpy.run_path(target, run_name="__main__"))
    except SystemExit as e:   # includes gmux.job.JobExit (exit or migrate at a boundary)
        _LEFT_BY_SCRIPTS.append(e)
        code = e.code
        status = exit_status(code)
        reason = "finished" if status == 0 else f"exit status {status}"
        if code is not None and not isinstance(code, int):
            try:
                print(code, file=sys.stderr)
            except (OSError, ValueError):
                pass    # (as above, in print_script_traceback)
    except KeyboardInterrupt as e:   # (Ctrl-C, or SIGINT sent to it: the script's traceback, as Python shows it)
        _LEFT_BY_SCRIPTS.append(e)
        print_script_traceback(e, target if kind == "path" else None)
        status, reason = 130, "interrupted (SIGINT)"
    except BaseException as e:
        _LEFT_BY_SCRIPTS.append(e)
        print_script_traceback(e, target if kind == "path" else None)
        from .memory.limit import explain   # torch's CUDA OOM error does not say it was the job's limit
        status, reason = 1, (explain(e) or f"{type(e).__name__}: {e}")[:500]
    finally:
        sys.argv = saved_argv
    return status, reason


def print_script_traceback(e: BaseException, script: Optional[str] = None) -> None:
    """The traceback python would print for the script: from the script's own frame on, without the runner's
    and runpy's frames above it (all of them where the failure is the runner's own), and the `script`'s path
    absolute, as python shows it (runpy compiles it under the path as typed, which is also the sys.argv[0]
    and __file__ the script sees)."""
    tb = e.__traceback__
    while tb is not None and _outside_the_script(tb.tb_frame.f_code.co_filename):
        tb = tb.tb_next
    shown = traceback.TracebackException(type(e), e, tb if tb is not None else e.__traceback__)
    if script is not None:
        _absolute(shown, script, os.path.abspath(script), set())
    try:
        print("".join(shown.format()), end="", file=sys.stderr)
    except (OSError, ValueError):
        # stderr a pipe whose reader is gone (`| head`, a `| tee` ended by the same Ctrl-C) or closed: the job's
        # exit record still says why it ended, where a BrokenPipeError here left none (gmux ps: "lost", "the OOM
        # killer")
        pass


def _absolute(shown: traceback.TracebackException, typed: str, path: str, seen: set) -> None:
    """`shown` and the exceptions chained to it, their frames in `typed` named by `path`."""
    if id(shown) in seen:
        return
    seen.add(id(shown))
    for frame in shown.stack:
        if frame.filename == typed:
            frame.filename = path
    for chained in (shown.__cause__, shown.__context__):
        if chained is not None:
            _absolute(chained, typed, path, seen)


def _outside_the_script(filename: str) -> bool:
    return filename in (__file__, runpy.__file__) or filename.startswith("<frozen runpy")


def exit_status(code) -> int:
    """The status the system sees for sys.exit(code), as Python gives it: an int modulo 256 (300 is 44, -9 is
    247, True is 1), 255 for one beyond a C long, 0 for None and 1 for anything else (which is printed)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return int(code) & 0xFF if -2 ** 63 <= code < 2 ** 63 else 255
    return 1
