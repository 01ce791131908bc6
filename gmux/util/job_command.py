"""What a job's command line runs: a Python script or module, in gmux's own process (so that gmux sees its
optimizer steps); checked by `gmux submit` before anything starts and by gmux-launch before it registers."""
from __future__ import annotations

import os
from typing import Optional


def script_of(argv: list, cwd: Optional[str] = None) -> tuple[str, str, list]:
    """('path'|'module', target, sys.argv for it) from `python [-u] train.py args`, `python -m mod args`
    or `train.py args`; ValueError, naming the problem, for anything else (a job is a Python script run in
    gmux's own process). `cwd`: where a relative script path is looked for (this process's, by default)."""
    args = list(argv)
    if args and os.path.basename(args[0]).startswith("python"):
        args = args[1:]
        while args and args[0].startswith("-") and args[0] != "-m":
            if args[0] in ("-c",):
                raise ValueError("a job runs a script or a module (-m), not python -c")
            args = args[1:]   # interpreter flags (-u, -O, ...) do not change what runs
        if args and args[0] == "-m":
            if len(args) < 2:
                raise ValueError("python -m needs a module name")
            return "module", args[1], args[1:]
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
    return None
