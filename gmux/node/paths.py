"""Where a gmuxd keeps its socket, database, logs and checkpoints: one private runtime directory.

The directory is mode 0700 because the socket in it is the daemon's front door: only the user who runs
gmuxd may reach it. The admin token (mode 0600) separates the CLI from jobs: a job is given only its own
token, so its messages can act only on itself.
"""
from __future__ import annotations

import os
import secrets
import stat
from dataclasses import dataclass


def default_runtime_dir() -> str:
    env = os.environ.get("GMUX_RUNTIME_DIR")
    if env:
        return env
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg and os.path.isdir(xdg):
        return os.path.join(xdg, "gmux")
    return f"/tmp/gmux-{os.getuid()}"


@dataclass(frozen=True)
class RuntimeDir:
    root: str

    @property
    def socket(self) -> str:
        return os.path.join(self.root, "gmuxd.sock")

    @property
    def endpoint(self) -> str:
        return "ipc://" + self.socket

    @property
    def db(self) -> str:
        return os.path.join(self.root, "gmuxd.db")

    @property
    def admin_token_file(self) -> str:
        return os.path.join(self.root, "admin.token")

    @property
    def pid_file(self) -> str:
        return os.path.join(self.root, "gmuxd.pid")

    def logs(self) -> str:
        return os.path.join(self.root, "logs")

    def checkpoints(self) -> str:
        return os.path.join(self.root, "checkpoints")

    def exits(self) -> str:
        return os.path.join(self.root, "exits")

    def log_file(self, job: str) -> str:
        return os.path.join(self.logs(), f"{job}.log")

    def checkpoint_file(self, job: str) -> str:
        return os.path.join(self.checkpoints(), f"{job}.ckpt")

    def spill_file(self, job: str) -> str:
        return os.path.join(self.checkpoints(), f"{job}.spill")

    def exit_file(self, job: str) -> str:
        return os.path.join(self.exits(), f"{job}.exit")

    def create(self) -> None:
        """Creates the directory tree private to this user; refuses one that others can enter."""
        os.makedirs(self.root, mode=0o700, exist_ok=True)
        st = os.stat(self.root)
        if st.st_uid != os.getuid():
            raise PermissionError(f"runtime directory {self.root} belongs to uid {st.st_uid}, not to you; "
                                  f"choose another with --runtime-dir or GMUX_RUNTIME_DIR")
        if stat.S_IMODE(st.st_mode) != 0o700:
            os.chmod(self.root, 0o700)
        for sub in (self.logs(), self.checkpoints(), self.exits()):
            os.makedirs(sub, mode=0o700, exist_ok=True)

    def admin_token(self, create: bool = False) -> str:
        """The admin token; a daemon creates it once (it survives restarts so a running CLI keeps working)."""
        try:
            with open(self.admin_token_file) as f:
                return f.read().strip()
        except FileNotFoundError:
            if not create:
                raise
        token = secrets.token_hex(16)
        tmp = self.admin_token_file + ".tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(token)
            f.flush()
            os.fsync(f.fileno())
        os.rename(tmp, self.admin_token_file)
        return token


def write_atomic(path: str, data: bytes) -> None:
    """temp file, fsync, rename: a reader sees the old file or the new one, never half of one."""
    tmp = f"{path}.tmp.{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(tmp, path)
