"""The contract between a job and its gmuxd: the runtime directory (socket, database, logs, checkpoints,
exit records) and how a process is identified (pid and start time).

A per-user daemon's directory is mode 0700 because the socket in it is the daemon's front door: only the user who
runs gmuxd may reach it. The admin token (mode 0600) separates the CLI from jobs: a job is given only its own
token, so its messages can act only on itself.

A system daemon's directory (gmuxd --system, run by root) is root's, mode 0750 and of the socket group, so that
the group's members reach the socket and nobody else does; who asks is then told by the kernel (the ipc peer's
uid), and there is no admin token. Each user's jobs write their checkpoints and exit records in users/UID, a
directory only that user (and root) can enter, made by gmuxd.
"""
from __future__ import annotations

import contextlib
import json
import os
import secrets
import socket
import stat
import time
from dataclasses import dataclass
from typing import Optional

from gmux.util.atomic import partials, write_atomic
from gmux.util.text import digits

SYSTEM_RUNTIME_DIR = "/run/gmux"   # the system daemon's (gmuxd --system; contrib/systemd/gmuxd.service)
MAX_EXIT_RECORD = 64 << 10         # an exit record is a status and a reason; more is not one
MAX_LEFT = 1000                    # processes an exit record lists as left running (~25 bytes each)


def _stream_pipe(name: str, mode: int, mine: bool) -> bool:
    """Whether a checkpoints/ entry is the pipe a cluster link streams a move's checkpoint through (it is the
    job's JOB.snapshot.ckpt while the move sends: gmux.node.cluster_stream), this user's. One is left by a gmuxd
    killed mid-send, and refused like anything else that is no file it kept the machine's next gmuxd from
    starting at all: the machine was counted lost, and the job held there for the move stopped itself, to start
    again elsewhere from its last checkpoint. It is let be, not removed: the check runs before gmuxd knows
    whether another one still runs here, whose send it may be, and the link removes a pipe left at that path
    before it asks the job for a checkpoint there (nothing else does)."""
    return mine and stat.S_ISFIFO(mode) and name.endswith(".snapshot.ckpt")


def private_runtime_dir() -> str:
    """This user's own daemon's directory (where `gmuxd` starts one unless told otherwise)."""
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg and os.path.isdir(xdg):
        return os.path.join(xdg, "gmux")
    return f"/tmp/gmux-{os.getuid()}"


def default_runtime_dir() -> str:
    """Where clients look for gmuxd: GMUX_RUNTIME_DIR if set; else this user's own daemon if it runs; else the
    system daemon if one runs (or its directory is closed to this user); else the private directory (whose
    error says how to start a daemon there)."""
    env = os.environ.get("GMUX_RUNTIME_DIR")
    if env:
        return env
    private = private_runtime_dir()
    if os.path.exists(RuntimeDir(private).socket):
        return private
    try:
        os.stat(RuntimeDir(SYSTEM_RUNTIME_DIR).socket)
        return SYSTEM_RUNTIME_DIR
    except PermissionError:   # a system daemon runs, for a group this user is not in: its error says so
        return SYSTEM_RUNTIME_DIR
    except OSError:
        return private


def not_a_directory(path: str) -> Optional[str]:
    """What stands in the way of `path` being a directory (itself, or the nearest part of it that exists, when
    that is a file): None when nothing does. A client told only "gmuxd is not running there" would look for a
    gmuxd, not at the path."""
    part = os.path.abspath(path)
    while not os.path.lexists(part) and os.path.dirname(part) != part:
        part = os.path.dirname(part)
    return None if os.path.isdir(part) else part


SOCKET_PATH_MAX = 107    # bytes of a Unix socket's path (sun_path, less its terminating zero)


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

    def daemon_process(self) -> Optional[tuple[int, int]]:
        """(pid, start time) of the gmuxd the pid file names (serving, or ended without removing it); None if
        there is none to read."""
        try:
            with open(self.pid_file) as f:
                pid, st = (int(x) for x in f.read().split())
        except (OSError, ValueError):
            return None
        return pid, st

    def beat(self) -> None:
        """A serving gmuxd's sign of life: its pid file's time, which a job may read where it may not read the
        file (a system daemon's) and which a gmuxd alive but not serving (stopped, hung) no longer moves."""
        with contextlib.suppress(OSError):
            os.utime(self.pid_file)

    def daemon_silence(self) -> Optional[float]:
        """Seconds since the gmuxd of this directory last beat; None without a pid file."""
        try:
            return max(0.0, time.time() - os.stat(self.pid_file).st_mtime)
        except OSError:
            return None

    def socket_id(self) -> Optional[tuple[int, int]]:
        """The socket file's (device, inode): which bind made it; None while there is none."""
        try:
            st = os.stat(self.socket)
        except OSError:
            return None
        return st.st_dev, st.st_ino

    def release(self, socket_id: Optional[tuple[int, int]]) -> None:
        """A gmuxd that ends removes its socket and pid file, but only while they are still its own: its
        directory removed under it, another gmuxd may have made both again, and serves through them."""
        if (self.daemon_process() or (None,))[0] != os.getpid():
            return      # (another's socket may even have this one's inode number, the file system reusing it)
        if socket_id is not None and self.socket_id() == socket_id:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.socket)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.pid_file)

    @staticmethod
    def discard(path: str, partials_only: bool = False) -> None:
        """Removes the file at `path` and the partial copies of it that a writer killed mid-write left beside it
        (tens of MB for a checkpoint). What cannot be removed (a read-only filesystem) stays."""
        for f in partials(path) + ([] if partials_only else [path]):
            with contextlib.suppress(OSError):
                os.unlink(f)

    def socket_answers(self) -> bool:
        """Whether a program listens on the socket's path (a stale file left by a gmuxd that ended does not)."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(1.0)
            try:
                s.connect(self.socket)
            except OSError:
                return False
        return True

    def logs(self) -> str:
        return os.path.join(self.root, "logs")

    def checkpoints(self) -> str:
        return os.path.join(self.root, "checkpoints")

    def exits(self) -> str:
        return os.path.join(self.root, "exits")

    def users(self) -> str:
        return os.path.join(self.root, "users")

    def user_dir(self, uid: int) -> str:
        return os.path.join(self.users(), str(uid))

    @property
    def system(self) -> bool:
        """A system daemon's tree: jobs write in users/UID (the job's side and gmuxd's agree by looking)."""
        return os.path.isdir(self.users())

    def _jobs_dir(self, private: str, uid: Optional[int]) -> str:
        # uid: the job's owner, as gmuxd knows it; None: this process's (the job itself)
        return self.user_dir(os.getuid() if uid is None else uid) if self.system else private

    def log_file(self, job: str) -> str:
        return os.path.join(self.logs(), f"{job}.log")

    def logged_job_numbers(self) -> list[int]:
        """The numbers of the jobs (j<N>) with a log here."""
        try:
            names = os.listdir(self.logs())
        except OSError:
            return []
        return [int(n[1:-4]) for n in names if n.startswith("j") and n.endswith(".log") and digits(n[1:-4])]

    def checkpoint_file(self, job: str, uid: Optional[int] = None) -> str:
        return os.path.join(self._jobs_dir(self.checkpoints(), uid), f"{job}.ckpt")

    def spill_file(self, job: str, uid: Optional[int] = None) -> str:
        return os.path.join(self._jobs_dir(self.checkpoints(), uid), f"{job}.spill")

    def exit_file(self, job: str, uid: Optional[int] = None) -> str:
        return os.path.join(self._jobs_dir(self.exits(), uid), f"{job}.exit")

    def create(self, group: Optional[int] = None) -> None:
        """Creates the directory tree private to this user, or takes over one that gmuxd made before. Refuses,
        changing nothing, a directory that could have been planted or redirected: a symlink, one owned by
        someone else, one that others could enter and that holds anything, or one holding a symlink, a file of
        another user or anything but files and directories (and the daemon's socket).
        With `group` (a system daemon, run by root): the top directory is mode 0750 and of that group, and
        users/ (0711) is made for the users' own directories."""
        mode = 0o700 if group is None else 0o750
        try:
            path = self.socket.encode()    # as ZeroMQ takes it: UTF-8
        except UnicodeError:
            raise RuntimeDirError(f"runtime directory {self.root!r}: its name is not UTF-8, which ZeroMQ needs for "
                                  f"the socket's path; choose another with --runtime-dir or GMUX_RUNTIME_DIR") from None
        if len(path) > SOCKET_PATH_MAX:
            raise RuntimeDirError(f"runtime directory {self.root}: its socket's path would be {len(path)} bytes, over "
                                  f"the {SOCKET_PATH_MAX} a Unix socket allows; choose a shorter one with "
                                  f"--runtime-dir or GMUX_RUNTIME_DIR")
        parent = os.path.dirname(os.path.abspath(self.root))
        try:
            os.makedirs(parent, mode=0o700 if group is None else 0o755, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            raise RuntimeDirError(f"runtime directory {self.root}: a part of {parent} is a file, not a directory; "
                                  f"choose another with --runtime-dir or GMUX_RUNTIME_DIR") from None
        if group is not None:
            self._check_parent(parent)
        try:
            os.mkdir(self.root, 0o700)   # opened to the group only once it is known to be ours (check)
        except FileExistsError:
            self._check_existing(mode)
        for sub in (self.logs(), self.checkpoints(), self.exits()) + ((self.users(),) if group is not None else ()):
            try:
                os.mkdir(sub, 0o700)
            except FileExistsError:
                pass
        if group is not None:
            # The group passes through this directory to the socket: the database (every job's token, argv and
            # environment) is made root's alone before SQLite opens it (its -wal and -shm files take its mode).
            os.close(os.open(self.db, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600))
        self.check(group)

    @staticmethod
    def _check_parent(parent: str) -> None:
        """A system daemon's directory must not be in one where another user could rename it away and put their
        own in its place: its parent is root's, and writable by others only if sticky (as /tmp, /run)."""
        st = os.stat(parent)
        if st.st_uid != 0 or (st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX):
            raise RuntimeDirError(f"{parent} (where the runtime directory goes) is not root's alone (owner uid "
                                  f"{st.st_uid}, mode {stat.S_IMODE(st.st_mode):o}): another user could replace "
                                  f"the directory; use /run/gmux, or a directory in one only root may change")

    def _check_existing(self, mode: int = 0o700) -> None:
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
        if stat.S_IMODE(st.st_mode) & ~mode & 0o777:
            if os.listdir(self.root):
                raise RuntimeDirError(f"runtime directory {self.root} is open to others (mode "
                                      f"{stat.S_IMODE(st.st_mode):o}) and not empty: anything in it may have been "
                                      f"put there by another user. Remove it (gmuxd makes it afresh), or choose "
                                      f"another with --runtime-dir or GMUX_RUNTIME_DIR")
            os.chmod(self.root, 0o700)

    def check(self, group: Optional[int] = None) -> None:
        """Every entry in the tree is this user's, and none is a symlink: nothing in it can redirect a write.
        A system tree's users/ holds one directory per user, owned by that user, whose contents gmuxd never
        follows into (it only ever names files directly in it)."""
        me = os.getuid()
        tops = (self.root, self.logs(), self.checkpoints(), self.exits())
        for top in tops + ((self.users(),) if group is not None else ()):
            st = os.lstat(top)
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != me:
                raise RuntimeDirError(f"{top} is not a directory of yours; remove it (gmuxd makes it afresh)")
            # the group's members pass through the top to the socket, and through users/ to their own directory
            mode = 0o711 if top == self.users() else 0o750 if top == self.root and group is not None else 0o700
            if top == self.root and group is not None and st.st_gid != group:
                os.chown(top, -1, group)
            if stat.S_IMODE(st.st_mode) != mode:
                os.chmod(top, mode)
            if top == self.users():
                self._check_users()
                continue
            if top == self.root and group is not None:
                self._close_files()
            with os.scandir(top) as entries:
                for e in entries:
                    est = e.stat(follow_symlinks=False)
                    if top == self.checkpoints() and _stream_pipe(e.name, est.st_mode, est.st_uid == me):
                        continue
                    kind = ("a symlink" if stat.S_ISLNK(est.st_mode) else
                            None if stat.S_ISREG(est.st_mode) or stat.S_ISDIR(est.st_mode) or stat.S_ISSOCK(est.st_mode)
                            else "not a file")
                    if kind is None and est.st_uid != me:
                        kind = f"owned by uid {est.st_uid}"
                    if kind:
                        raise RuntimeDirError(f"{e.path} is {kind}: gmuxd did not make it, and will not use a "
                                              f"runtime directory holding it. Remove it, or choose another "
                                              f"directory with --runtime-dir or GMUX_RUNTIME_DIR")

    def _close_files(self) -> None:
        """A system tree's own files are root's alone (mode 0600): the top directory is open to the group."""
        with os.scandir(self.root) as entries:
            for e in entries:
                est = e.stat(follow_symlinks=False)
                # (a regular file, not a symlink, in a directory only root may change: chmod cannot be redirected)
                if stat.S_ISREG(est.st_mode) and stat.S_IMODE(est.st_mode) & 0o077 and est.st_uid == os.getuid():
                    os.chmod(e.path, 0o600)

    def _check_users(self) -> None:
        with os.scandir(self.users()) as entries:
            for e in entries:
                est = e.stat(follow_symlinks=False)
                uid = int(e.name) if digits(e.name) else None
                if not (stat.S_ISDIR(est.st_mode) and est.st_uid == uid):
                    raise RuntimeDirError(f"{e.path} is not a user's directory made by gmuxd (users/UID, owned by "
                                          f"UID); remove it, or choose another directory with --runtime-dir")

    def make_user_dir(self, uid: int, gid: int) -> str:
        """users/UID, the one place a system daemon's job of that user writes (checkpoints, exit records): made
        by root in root's users/, so nobody could have planted it, then given to the user."""
        path = self.user_dir(uid)
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            st = os.lstat(path)
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != uid:
                raise RuntimeDirError(f"{path} is not a directory of uid {uid}; remove it (gmuxd makes it afresh)")
            return path
        os.chown(path, uid, gid)
        return path

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
def read_exit(rundir: RuntimeDir, job_id: str, uid: Optional[int] = None) -> Optional[dict]:
    """The job's exit record, or None. With `uid` (a system daemon reading a user's directory), only a regular
    file of that user, opened without following a symlink and without blocking on a FIFO, and read bounded:
    whatever else the user put there is no record of theirs."""
    try:
        fd = os.open(rundir.exit_file(job_id, uid), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or (uid is not None and st.st_uid != uid):
            return None
        record = json.loads(os.read(fd, MAX_EXIT_RECORD))
        return record if isinstance(record, dict) else None
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)


def write_exit(rundir: RuntimeDir, job_id: str, status: int, reason: str = "", left=(),
               step: Optional[int] = None) -> None:
    """Called by the launcher as the job ends: the record that tells a clean end from a SIGKILL (in a system
    daemon's tree, in this user's own directory), what the job left running outside its process group
    ([pid, start time] each, at most MAX_LEFT), for gmuxd to end, and its last step (a job that ended while no
    gmuxd was there to hear its last report)."""
    record = {"status": status, "reason": reason, **({"left": list(left)[:MAX_LEFT]} if left else {}),
              **({"step": step} if step is not None else {})}
    try:
        write_atomic(rundir.exit_file(job_id), json.dumps(record).encode())
    except OSError:
        pass  # the runtime dir is gone (daemon cleaned up): nobody to tell


# --- process identity ---
def started_environ(pid: int) -> frozenset:
    """The NAME=VALUE entries (bytes) of the environment the process started with (/proc/PID/environ: its later
    changes do not touch it); empty if gone or not ours to read."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return frozenset(f.read().split(b"\0"))
    except OSError:
        return frozenset()


def proc_starttime(pid: int) -> Optional[int]:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat); None if gone.

    With the pid it identifies a process uniquely: a pid reused by another process has another start time.
    """
    rest = _stat_after_name(pid)
    if rest and rest[0] == b"Z":   # a zombie has exited; only its parent's wait is missing
        return None
    try:
        return int(rest[19])
    except (IndexError, ValueError, TypeError):
        return None


def proc_exiting(pid: int) -> bool:
    """Whether the process is on its way out and not yet a zombie (the kernel's PF_EXITING in field 9 of
    /proc/PID/stat): killed or ended, and what it held (its sockets) may be closed already, so a peer may have
    seen it end."""
    return exiting_from_stat(_stat_after_name(pid))


def exiting_from_stat(rest: Optional[list]) -> bool:
    try:
        return bool(rest) and rest[0] != b"Z" and bool(int(rest[6]) & PF_EXITING)
    except (IndexError, ValueError):
        return False


PF_EXITING = 0x4        # (include/linux/sched.h)


def _stat_after_name(pid: int) -> Optional[list]:
    """/proc/PID/stat's fields from the third (the state) on; None if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    # The command name (field 2) may contain spaces and parentheses: split after its last ')'.
    return data[data.rfind(b")") + 2:].split()


def alive(pid: int, starttime: Optional[int]) -> bool:
    if pid <= 0:
        return False
    st = proc_starttime(pid)
    return st is not None and (starttime is None or st == starttime)


def my_starttime() -> Optional[int]:
    return proc_starttime(os.getpid())
