"""The environment and directory a submitted job takes from the shell that submits it (gmux submit, locally or to
a cluster).

The job runs later, elsewhere, as a child of gmuxd: it gets what a training script needs to behave as it would in
this shell (paths, locale, thread and torch settings, gmux's own job knobs), never the names of this shell's
daemon, keys or tokens, which gmuxd sets for the job itself.
"""
from __future__ import annotations

import os
from typing import Mapping, Optional

from gmux.util.job_command import script_of

PASSED = ("PATH", "PYTHONPATH", "HOME", "USER", "LANG")
PASSED_PREFIXES = ("OMP_", "MKL_", "TORCH_", "GMUX_")
WITHHELD = ("GMUX_RUNTIME_DIR", "GMUX_JOB_TOKEN", "GMUX_KEYS", "GMUX_CLUSTER", "GMUX_KEY_NAME")


def submit_env(environ: Optional[Mapping[str, str]] = None) -> dict:
    environ = os.environ if environ is None else environ
    return {k: v for k, v in environ.items()
            if (k in PASSED or k.startswith(PASSED_PREFIXES)) and k not in WITHHELD}


def submit_cwd(argv: list) -> str:
    """The directory the job starts in: the shell's, which must still exist; ValueError, naming the problem,
    also for a command a job cannot run (gmux.util.job_command), refused here rather than in the job's log."""
    try:
        cwd = os.getcwd()
    except FileNotFoundError:
        raise ValueError("this shell's directory no longer exists; cd to the job's directory and submit again") \
            from None
    script_of(argv, cwd)
    return cwd
