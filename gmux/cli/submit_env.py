"""The environment and directory a submitted job takes from the shell that submits it (gmux submit, locally or to
a cluster).

The job runs later, elsewhere, as a child of gmuxd: it gets what a training script needs to behave as it would in
this shell (paths, locale, thread and torch settings, gmux's own job knobs), never the names of this shell's
daemon, keys or tokens, which gmuxd sets for the job itself.
"""
from __future__ import annotations

import os
from typing import Mapping, Optional

from gmux.util.job_command import foreign_program, missing_script, script_of

# (PYTHONHASHSEED and CUBLAS_WORKSPACE_CONFIG: a deterministic run's settings, which gmuxd's own would replace)
PASSED = ("PATH", "PYTHONPATH", "HOME", "USER", "LANG", "PYTHONHASHSEED", "PYTHONUNBUFFERED", "CUBLAS_WORKSPACE_CONFIG")
PASSED_PREFIXES = ("OMP_", "MKL_", "TORCH_", "GMUX_", "NCCL_", "HF_")
WITHHELD = ("GMUX_RUNTIME_DIR", "GMUX_JOB_ID", "GMUX_JOB_TOKEN", "GMUX_KEYS", "GMUX_KEY_NAME")


def submit_env(environ: Optional[Mapping[str, str]] = None) -> dict:
    environ = os.environ if environ is None else environ
    return {k: v for k, v in environ.items()
            if (k in PASSED or k.startswith(PASSED_PREFIXES)) and k not in WITHHELD}


def submit_cwd(argv: list, here: bool = True) -> str:
    """The directory the job starts in: the shell's, which must still exist; ValueError, naming the problem,
    also for a command a job cannot run (gmux.util.job_command) or, where the job starts on this machine
    (`here`), a script that is not there: refused here rather than in the job's log."""
    try:
        cwd = os.getcwd()
    except FileNotFoundError:
        raise ValueError("this shell's directory no longer exists; cd to the job's directory and submit again") \
            from None
    kind, target, _ = script_of(argv, cwd)
    problem = missing_script(kind, target, cwd) if here else foreign_program(kind, target, cwd)
    if problem:
        raise ValueError(problem)
    return cwd


def check_text(argv: list, env: Mapping[str, str], cwd: str) -> None:
    """ValueError naming the first argument, variable or directory that is not UTF-8 text: the wire carries text,
    and bytes that are not (a file name in another encoding) would reach the job changed."""
    for what, text in ([("the directory", cwd)] + [(f"argument {i + 1}", t) for i, t in enumerate(argv)] +
                       [(f"environment variable {k}", k + "=" + v) for k, v in env.items()]):
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            shown = text.encode("utf-8", "surrogateescape")[:80]
            raise ValueError(f"{what} is not UTF-8 text ({shown!r}): gmux passes text only; rename it or set "
                             f"LC_ALL/LANG to the encoding it is in") from None
