"""Talking to a gmuxd as its administrator (the CLI, the demo, the cluster link, tests): one request, one reply.

To a per-user gmuxd the client proves it is the user with the admin token it reads; to a system gmuxd it proves
nothing itself (the kernel says which user connected)."""
from __future__ import annotations

import os
from typing import Any, Optional

import zmq

from gmux import protocol
from gmux.rundir import RuntimeDir, alive, default_runtime_dir, not_a_directory
from gmux.wire.request import Requester


class GmuxError(RuntimeError):
    """gmuxd refused a request or cannot be reached; the message says what to do."""


class GmuxBusy(GmuxError):
    """gmuxd refused a request only for now: the job is busy with something that ends by itself (a suspend, a
    move); the same request may succeed in a moment."""


class GmuxUnanswered(GmuxError):
    """gmuxd did not answer: the request may have been carried out or not."""


def unavailable_message(endpoint: str, timeout: Optional[float] = None, running: bool = True) -> str:
    """For a gmuxd that is not running, or did not answer in `timeout` s. One whose process runs (its pid file
    says) is busy, or stopped: never to be started again."""
    rundir = os.path.dirname(endpoint[len("ipc://"):]) if endpoint.startswith("ipc://") else None
    asked = RuntimeDir(rundir) if rundir and running else None      # (a gmuxd that did not answer)
    daemon = asked.daemon_process() if asked else None
    if daemon is not None and alive(*daemon):
        return (f"gmuxd (pid {daemon[0]}) is running but did not answer at {endpoint} in {timeout:g} s: it is busy "
                f"(or stopped); try again in a moment")
    if asked and os.path.exists(asked.pid_file) and not os.access(asked.pid_file, os.R_OK):
        # A system gmuxd's pid file is root's alone (docs/security.md): whether it runs cannot be told from here,
        # and starting one is not this user's to do.
        return (f"gmuxd did not answer at {endpoint} in {timeout:g} s. It is the machine's system gmuxd (its pid "
                f"file is not yours to read): busy, stopped or ended; try again in a moment, and if it stays silent "
                f"ask the machine's administrator")
    hint = f"gmuxd --runtime-dir {rundir}" if rundir else "gmuxd"
    what = f"is not answering at {endpoint} (waited {timeout:g} s)" if running else f"is not running at {endpoint}"
    return (f"gmuxd {what}. Start it with `{hint} &` (add --virtual-gpus 2x16GiB on a machine without GPUs), "
            f"or point GMUX_RUNTIME_DIR at a running one.")


def closed_message(root: str) -> str:
    """For a user kept out of a gmuxd's directory: a per-user gmuxd serves its user, a system one the members
    of its socket group."""
    import grp
    import pwd
    try:
        st = os.stat(root)
    except OSError:
        st = None
    # A directory only its owner can enter is a per-user gmuxd's (root's too); a system one lets its group in.
    if st is not None and (st.st_uid != 0 or not st.st_mode & 0o070):
        try:
            owner = pwd.getpwuid(st.st_uid).pw_name
        except KeyError:
            owner = f"uid {st.st_uid}"
        return (f"cannot reach gmuxd in {root}: permission denied; it is {owner}'s own gmuxd, which serves only "
                f"them. Start one of your own (gmuxd, with GMUX_RUNTIME_DIR unset) or use the machine's system gmuxd")
    try:
        group = grp.getgrgid(st.st_gid).gr_name
    except (AttributeError, KeyError):
        group = None
    # (never advise joining root's or another privileged group: that gives far more than gmux)
    how = (f" (usermod -aG {group} USER, then log in again)" if group and st is not None and st.st_gid != 0
           and group not in PRIVILEGED_GROUPS else "")
    return (f"cannot reach gmuxd in {root}: permission denied. A system gmuxd serves the members of "
            f"{group or 'its socket group'}; ask its admin to add you{how}, or run a gmuxd of your own "
            f"(GMUX_RUNTIME_DIR elsewhere)")


PRIVILEGED_GROUPS = ("root", "wheel", "sudo", "admin", "adm", "docker", "disk", "shadow", "staff")


class Client:
    def __init__(self, runtime_dir: Optional[str] = None, timeout: float = 5.0):
        self.rundir = RuntimeDir(runtime_dir or default_runtime_dir())
        self.timeout = timeout
        try:
            os.stat(self.rundir.socket)
        except PermissionError:
            raise GmuxError(closed_message(self.rundir.root)) from None
        except NotADirectoryError:      # (not "gmuxd is not running": no gmuxd could run there)
            raise GmuxError(f"{not_a_directory(self.rundir.root)} is a file, not a directory: it cannot be a gmuxd's "
                            f"runtime directory") from None
        except OSError:
            raise GmuxError(unavailable_message(self.rundir.endpoint, running=False)) from None
        try:
            self.admin = self.rundir.admin_token()
        except FileNotFoundError:
            # A system gmuxd (gmuxd --system) has no token: the kernel tells it which user asks, and it answers
            # for that user's jobs. A per-user one refuses the empty token, naming the file to read.
            self.admin = ""
        except PermissionError:
            raise GmuxError(f"cannot read {self.rundir.admin_token_file}: run gmux as the user running gmuxd")
        except OSError as e:     # e.g. ELOOP: the token is a symlink, which gmux never follows
            raise GmuxError(f"cannot read {self.rundir.admin_token_file}: {e.strerror}") from None
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(self.rundir.endpoint)
        self.daemon = self.rundir.daemon_process()     # the gmuxd that will answer (None: not ours to read)
        self.ran = self.daemon is not None and alive(*self.daemon)
        self.requests = Requester(self.sock, "gmuxd", GmuxError,
                                  lambda waited: unavailable_message(self.rundir.endpoint, waited), busy=GmuxBusy,
                                  gone=self._daemon_gone, unanswered=GmuxUnanswered)

    def _daemon_gone(self) -> Optional[str]:
        """A gmuxd that ended while a request waited never answers it (a restarted one does not know it)."""
        if self.daemon is None or alive(*self.daemon):
            return None
        if not self.ran:        # (killed before: its socket file is all that is left)
            return unavailable_message(self.rundir.endpoint, running=False)
        return (f"gmuxd (pid {self.daemon[0]}) ended before it answered; its jobs run on and a restarted gmuxd "
                f"re-attaches them: start it again (gmuxd --runtime-dir {self.rundir.root}) and check with gmux ps")

    def call(self, mtype: str, timeout: Optional[float] = None, late_ok: bool = False, **fields: Any) -> Any:
        """The reply to `mtype`. A reply that the job was found late (past its deadline and not stopped: it
        computes on, and the command waits for its next boundary) is raised as an error, as a refusal would be,
        unless the caller takes it (`late_ok`): what was asked is not done yet (the cluster link retries)."""
        if mtype in protocol.ADMIN_TYPES:
            fields["admin"] = self.admin
        reply = self.requests.call(mtype, self.timeout if timeout is None else timeout, **fields)
        if not late_ok and isinstance(reply, dict) and reply.get("kind") == "late":
            raise GmuxError(reply.get("detail") or f"{mtype}: the job has not reached a boundary yet")
        return reply

    def close(self) -> None:
        self.sock.close(0)
