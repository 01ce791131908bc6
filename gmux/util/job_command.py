"""What a job's command line runs: a Python script or module, in gmux's own process (so that gmux sees its
optimizer steps); checked by `gmux submit` before anything starts and by gmux-launch before it registers."""
from __future__ import annotations

import os
from typing import Optional


# The interpreter options a job's process takes as they are given (the others, such as -S or -E, would change how
# gmux itself is found, and are dropped); -W and -X take the next argument as their value.
KEPT_OPTIONS = ("-u", "-O", "-OO", "-B", "-b", "-bb", "-W", "-X")
_WITH_VALUE = ("-W", "-X", "--check-hash-based-pycs")


def _options_and_rest(argv: list) -> tuple[list, list]:
    """(interpreter options, the rest) of `python [options] ...`; ([], argv) for a command not run by python."""
    if not argv or not os.path.basename(argv[0]).startswith("python"):
        return [], list(argv)
    options, args = [], list(argv[1:])
    while args and args[0].startswith("-") and args[0] != "-m":
        flags = args[0][1:] if not args[0].startswith(("--", "-W", "-X")) else ""   # (python -uc: -u -c)
        if args[0] == "-" or "c" in flags:
            raise ValueError("a job runs a script or a module (-m), not python -c or a script read from stdin")
        if "i" in flags:
            raise ValueError("python -i: a job runs unattended, with no prompt after its script (a prompt would "
                             "keep the job's GPU memory after gmux counts it ended); leave out -i")
        n = 2 if args[0] in _WITH_VALUE else 1
        if len(args) < n:
            raise ValueError(f"python {args[0]} needs a value")
        options += args[:n]
        args = args[n:]
    return options, args


def interpreter_options(argv: list) -> list:
    """The options of `python [options] train.py` that the job's own interpreter is started with (KEPT_OPTIONS:
    -u, -O, -W ignore, -X faulthandler, ...): it runs the script in gmux's process, not a python of its own."""
    options, _ = _options_and_rest(argv)
    kept, i = [], 0
    while i < len(options):
        n = 2 if options[i] in _WITH_VALUE else 1
        if options[i] in KEPT_OPTIONS or options[i][:2] in ("-W", "-X"):    # (also -Wignore, -Xdev)
            kept += options[i:i + n]
        i += n
    return kept


def script_of(argv: list, cwd: Optional[str] = None) -> tuple[str, str, list]:
    """('path'|'module', target, sys.argv for it) from `python [-u] train.py args`, `python -m mod args`
    or `train.py args`; ValueError, naming the problem, for anything else (a job is a Python script run in
    gmux's own process). `cwd`: where a relative script path is looked for (this process's, by default)."""
    _, args = _options_and_rest(argv)
    if args and args[0] == "-m":
        if len(args) < 2:
            raise ValueError("python -m needs a module name")
        return "module", args[1], args[1:]
    # (a directory named *.py reaches missing_script, which says it is not a file)
    if args and not args[0].endswith(".py") and os.path.isdir(os.path.join(cwd or ".", args[0])):
        raise ValueError(f"{args[0]!r} is a directory, not a script: a job is a Python training script, run in gmux's "
                         f"own process. Write: -- python train.py ARGS")
    if not args or not args[0].endswith(".py") and not os.path.isfile(os.path.join(cwd or ".", args[0])):
        raise ValueError(f"a job is a Python training script, run in gmux's own process; got {argv!r}. "
                         f"Write: -- python train.py ARGS")
    return "path", args[0], args


def missing_script(kind: str, target: str, cwd: str) -> Optional[str]:
    """Why what script_of found cannot start in `cwd` on this machine (its script is not there), or None. A
    module is found only as the job starts (finding it here could run its packages' code in this process)."""
    path = os.path.join(cwd, target)
    if kind == "path" and not os.path.isfile(path):
        return f"no script {target!r} in {cwd}" if not os.path.exists(path) else f"{target!r} is not a file"
    if kind == "path" and not target.endswith(".py"):
        return _not_python(path, target)
    return None


def foreign_program(kind: str, target: str, cwd: str) -> Optional[str]:
    """For a job that starts on another machine (a cluster's), where its script is looked for: why a file at its
    path here is not a Python script (a program, a shell script), or None. One found here is taken for what is
    there too (machines share such paths: /bin/sleep, /usr/bin/env), refused here rather than after the start
    failed on every machine tried."""
    path = os.path.join(cwd, target)
    if kind == "path" and not target.endswith(".py") and os.path.isfile(path):
        return _not_python(path, target)
    return None


def _not_python(path: str, target: str) -> Optional[str]:
    """Why a script without .py is not Python (a program, a shell script), or None: run as Python it would fail
    in the job's log with a SyntaxError."""
    try:
        with open(path, "rb") as f:
            head = f.read(4096)
    except OSError as e:
        return f"cannot read {target!r}: {e.strerror}"
    first = head.split(b"\n", 1)[0]
    if b"\0" in head:
        runs = "a program, not a Python script"
    elif first.startswith(b"#!") and b"python" not in first:
        runs = f"a script for {first[2:].strip().decode(errors='replace')!r}, not Python"
    else:
        return None
    return f"{target!r} is {runs}: a job is a Python script run in gmux's own process. Write: -- python train.py ARGS"
