"""The contract between a job and its gmuxd: the private runtime directory (socket, database, logs, checkpoints,
exit records) and how a process is identified (pid and start time).

The directory is mode 0700 because the socket in it is the daemon's front door: only the user who runs
gmuxd may reach it. The admin token (mode 0600) separates the CLI from jobs: a job is given only its own
token, so its messages can act only on itself.
"""
from __future__ import annotations

import json
import os
import secrets
import stat
from dataclasses import dataclass
from typing import Optional

from gmux.util.atomic import write_atomic


def default_runtime_dir() -> str:
    env = os.environ.get("GMUX_RUNTIME_DIR")
    if env:
        return env
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg and os.path.isdir(xdg):
        return os.path.join(xdg, "gmux")
    return f"/tmp/gmux-{os.getuid()}"


class RuntimeDirError(PermissionError):
    """A runtime directory gmuxd will not use; the message says why and what to do."""


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
        """Creates the directory tree private to this user, or takes over one that gmuxd made before. Refuses,
        changing nothing, a directory that could have been planted or redirected: a symlink, one owned by
        someone else, one that others could enter and that holds anything, or one holding a symlink, a file of
        another user or anything but files and directories (and the daemon's socket)."""
        parent = os.path.dirname(os.path.abspath(self.root))
        os.makedirs(parent, mode=0o700, exist_ok=True)
        try:
            os.mkdir(self.root, 0o700)
        except FileExistsError:
            self._check_existing()
        for sub in (self.logs(), self.checkpoints(), self.exits()):
            try:
                os.mkdir(sub, 0o700)
            except FileExistsError:
                pass
        self.check()

    def _check_existing(self) -> None:
        st = os.lstat(self.root)
        if stat.S_ISLNK(st.st_mode):
            raise RuntimeDirError(f"runtime directory {self.root} is a symlink (to {os.readlink(self.root)!r}); "
                                  f"gmuxd does not follow it. Remove it, or choose another with --runtime-dir or "
                                  f"GMUX_RUNTIME_DIR")
        if not stat.S_ISDIR(st.st_mode):
            raise RuntimeDirError(f"runtime directory {self.root} exists and is not a directory")
        if st.st_uid != os.getuid():
            raise RuntimeDirError(f"runtime directory {self.root} belongs to uid {st.st_uid}, not to you; choose "
                                  f"another with --runtime-dir or GMUX_RUNTIME_DIR")
        if stat.S_IMODE(st.st_mode) & 0o077:
            if os.listdir(self.root):
                raise RuntimeDirError(f"runtime directory {self.root} is open to others (mode "
                                      f"{stat.S_IMODE(st.st_mode):o}) and not empty: anything in it may have been "
                                      f"put there by another user. Remove it (gmuxd makes it afresh), or choose "
                                      f"another with --runtime-dir or GMUX_RUNTIME_DIR")
            os.chmod(self.root, 0o700)

    def check(self) -> None:
        """Every entry in the tree is this user's, and none is a symlink: nothing in it can redirect a write."""
        me = os.getuid()
        for top in (self.root, self.logs(), self.checkpoints(), self.exits()):
            st = os.lstat(top)
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != me:
                raise RuntimeDirError(f"{top} is not a directory of yours; remove it (gmuxd makes it afresh)")
            if stat.S_IMODE(st.st_mode) != 0o700:
                os.chmod(top, 0o700)
            with os.scandir(top) as entries:
                for e in entries:
                    est = e.stat(follow_symlinks=False)
                    kind = ("a symlink" if stat.S_ISLNK(est.st_mode) else
                            None if stat.S_ISREG(est.st_mode) or stat.S_ISDIR(est.st_mode) or stat.S_ISSOCK(est.st_mode)
                            else "not a file")
                    if kind is None and est.st_uid != me:
                        kind = f"owned by uid {est.st_uid}"
                    if kind:
                        raise RuntimeDirError(f"{e.path} is {kind}: gmuxd did not make it, and will not use a "
                                              f"runtime directory holding it. Remove it, or choose another "
                                              f"directory with --runtime-dir or GMUX_RUNTIME_DIR")

    def open_private(self, path: str, append: bool = False) -> int:
        """A file under the tree, opened for writing without following a symlink (O_NOFOLLOW) and created 0600."""
        flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | (os.O_APPEND if append else os.O_TRUNC)
        return os.open(path, flags, 0o600)

    def admin_token(self, create: bool = False) -> str:
        """The admin token; a daemon creates it once (it survives restarts so a running CLI keeps working)."""
        try:
            fd = os.open(self.admin_token_file, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            with os.fdopen(fd) as f:
                return f.read().strip()
        except FileNotFoundError:
            if not create:
                raise
        token = secrets.token_hex(16)
        write_atomic(self.admin_token_file, token.encode())
        return token


# --- exit records: how a process that is not gmuxd's child ended ---
def read_exit(rundir: RuntimeDir, job_id: str) -> Optional[dict]:
    try:
        with open(rundir.exit_file(job_id)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def write_exit(rundir: RuntimeDir, job_id: str, status: int, reason: str = "") -> None:
    """Called by the launcher as the job ends: the record that tells a clean end from a SIGKILL."""
    try:
        write_atomic(rundir.exit_file(job_id), json.dumps({"status": status, "reason": reason}).encode())
    except OSError:
        pass  # the runtime dir is gone (daemon cleaned up): nobody to tell


# --- process identity ---
def proc_starttime(pid: int) -> Optional[int]:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat); None if gone.

    With the pid it identifies a process uniquely: a pid reused by another process has another start time.
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    # The command name (field 2) may contain spaces and parentheses: split after its last ')'.
    rest = data[data.rfind(b")") + 2:].split()
    if rest and rest[0] == b"Z":   # a zombie has exited; only its parent's wait is missing
        return None
    try:
        return int(rest[19])
    except (IndexError, ValueError):
        return None


def alive(pid: int, starttime: Optional[int]) -> bool:
    if pid <= 0:
        return False
    st = proc_starttime(pid)
    return st is not None and (starttime is None or st == starttime)


def my_starttime() -> Optional[int]:
    return proc_starttime(os.getpid())
