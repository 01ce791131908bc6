"""A daemon's limit on open files, raised to what the administrator allows it.

A daemon that serves connections holds a file per peer; at the usual soft limit of 1024 a few hundred careless
or hostile peers would take its last one, and libzmq's ipc listener aborts the process on EMFILE. The hard limit
is what the administrator allows (systemd's LimitNOFILE), so a daemon raises its soft limit to it. The jobs it
starts inherit that limit, as a service's processes do under LimitNOFILE (a DataLoader sharing tensors through
files is glad of it).
"""
from __future__ import annotations

import os
import resource

CEILING = 1 << 20      # where the hard limit is unlimited: the kernel's default nr_open


def raise_soft_limit() -> int:
    """Raises this process's soft limit to the hard limit (at most CEILING); returns the soft limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = CEILING if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        except (ValueError, OSError):      # above fs.nr_open: keep what we have
            pass
    return soft_limit()


def soft_limit() -> int:
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return CEILING if soft == resource.RLIM_INFINITY else soft


def open_files() -> int:
    """How many files this process holds open."""
    return len(os.listdir("/proc/self/fd")) - 1     # (less the one listdir itself held open)
