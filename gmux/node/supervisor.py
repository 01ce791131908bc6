"""Processes: spawning submitted jobs with their logs, and finding out how any job's process ended.

gmuxd spawns a submitted job as `gmux-launch --job ID -- argv` (token in its environment) in its own session (so a
daemon restart or a terminal hang-up does not take the job with it), output appended to logs/ID.log. A job started
by gmux-launch from a shell is not gmuxd's child, and neither are its own children after a daemon restart:
for those the launcher leaves an exit record (exits/ID.exit) and a missing record means the process was
killed outright (SIGKILL, the OOM killer).

It also takes a GPU's compute away from a job that does not stop in time (SIGSTOP, later SIGCONT): the job's
process group when it leads one of its own (a submitted job, or one started in its own session: its
DataLoader workers stop with it), else the process and its descendants, so that a shell or a driver script
that shares the job's group is never stopped with it; and, either way, the job's processes that left its group
(a server it started in a session of its own, a daemon it double-forked): its descendants (gmux-launch keeps the
orphans of its tree as its own, gmux.util.process_tree), the processes that began with its marks in their
environment, and, once it has exited, what its exit record says it left. Killing a job and ending what it left
signal the same processes. A stop someone else sent while gmuxd held the job (Ctrl-Z) is not undone by gmuxd's
SIGCONT.

Under a system daemon (root), a submitted job runs as the user who submitted it (their uid, gid and groups, set
in the child before it executes anything), and a process is signalled only while it is still that user's.
"""
from __future__ import annotations

import contextlib
import errno
import os
import pwd
import signal
import subprocess
import sys
import time
from typing import Callable, Optional

from gmux.node.access import user_groups
from gmux.node.jobs import Job
from gmux.rundir import MAX_LEFT, RuntimeDir, alive, proc_exiting, proc_starttime, read_exit, started_environ
from gmux.util.job_command import interpreter_options
from gmux.util.process_tree import descendants

# What a system daemon's own environment says about root, which a job started as its user must not inherit (the
# rest, e.g. an admin's CUDA or NCCL settings in the unit, reaches every job).
_ROOTS_OWN = ("HOME", "USER", "LOGNAME", "MAIL", "SHELL", "NOTIFY_SOCKET", "CREDENTIALS_DIRECTORY",
              "GMUX_KEYS", "GMUX_KEY_NAME")


# How long what a job left running has to end after SIGTERM before it is killed (as `docker stop` gives).
LEFTOVER_GRACE_S = 10.0


class CannotStart(Exception):
    """A submitted job's process could not be started; the message says why."""


class Supervisor:
    def __init__(self, rundir: RuntimeDir, system: bool = False, log_limit: int = 0):
        self.rundir = rundir
        self.system = system     # gmuxd --system: jobs run as their owners
        self.log_limit = log_limit   # a submitted job's log's bytes (gmuxd --log-limit), held by the job too
        # Popen objects are kept so that poll() reaps exactly our children and reads their status.
        self.children: dict[int, subprocess.Popen] = {}
        self.leaving: dict[int, Job] = {}   # ended submitted jobs by pid: what is left of them to end
        self.ending: dict[int, tuple[Job, float]] = {}   # ... asked to end: killed at the time given (monotonic)

    def spawn(self, job: Job) -> int:
        # (--gpus: its process says what it is when a gmuxd that lost its table is asked to take it back)
        # (a hooked rank of a submitted gang agrees with its peers on the boundary to act at, as torchrun's do)
        rank = ["--gang", job.gang["id"], "--rank", str(job.gang["rank"]), "--world", str(job.gang["size"])] \
            if job.gang and job.hook else []
        # (python -u / -W ignore ...: the options of the job's own command line are its process's)
        cmd = [sys.executable, *interpreter_options(job.argv), "-m", "gmux.cli.launch", "--runtime-dir",
               self.rundir.root, "--job", job.id,
               "--gpus", str(job.gpus_wanted), *([] if job.hook else ["--no-hook"]), *rank, "--", *job.argv]
        # The token travels in the environment, not on the command line that `ps` shows to everyone.
        env = {**os.environ, **job.env, "GMUX_RUNTIME_DIR": self.rundir.root, "GMUX_JOB_TOKEN": job.token}
        as_user = {}
        if self.system:
            pw = pwd.getpwuid(job.uid)    # the caller checked that the owner is a known user
            env = {k: v for k, v in os.environ.items() if k not in _ROOTS_OWN}
            env.update({"HOME": pw.pw_dir, "USER": pw.pw_name, "LOGNAME": pw.pw_name, **job.env,
                        "GMUX_RUNTIME_DIR": self.rundir.root, "GMUX_JOB_TOKEN": job.token})
            # setgroups, setgid, setuid in the child, before exec: nothing of the job ever runs as root.
            as_user = {"user": job.uid, "group": job.gid, "extra_groups": user_groups(job.uid, job.gid)}
            if job.cwd:
                # Popen enters cwd before it drops root: the user's own launcher enters it instead (--cwd), and
                # the launcher's very chdir, made as the user now from where it starts (a shell's cd reads '..' and
                # '-' its own way), refuses a directory they may not enter before anything exists, with one message
                # whether it is missing or closed to them: what exists there is not theirs to learn.
                if subprocess.run([sys.executable, "-I", "-S", "-c", "import os, sys; os.chdir(sys.argv[1])",
                                   job.cwd], cwd="/", env={}, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL, **as_user).returncode:
                    raise CannotStart(f"{pw.pw_name} cannot enter {job.cwd} (it does not exist, or is closed to "
                                      f"them)")
                cmd[cmd.index("--"):cmd.index("--")] = ["--cwd", job.cwd]
        env.pop("GMUX_JOB_ID", None)    # another job's (a gmuxd or submit inside a job) would mark this one as its
        env["GMUX_LOG_LIMIT"] = str(self.log_limit)     # (gmux.job.log_output: held between gmuxd's trims)
        path = self.rundir.log_file(job.id)
        try:
            fd = self.rundir.open_private(path, append=True)
        except OSError as e:    # a read-only or full filesystem: gmuxd's, not the job's failure
            raise CannotStart(f"cannot write {path}: " + ("it is a symbolic link, which gmuxd writes no log through"
                                                          if e.errno == errno.ELOOP else e.strerror)) from None
        with os.fdopen(fd, "ab") as log:
            try:
                p = subprocess.Popen(cmd, cwd="/" if self.system else job.cwd or None, env=env,
                                     stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                     start_new_session=True, **as_user)
            except OSError as e:
                if os.fstat(log.fileno()).st_size == 0:
                    os.unlink(path)      # a refusal leaves nothing: the next job given this id starts a log anew
                if job.cwd and e.filename == job.cwd:
                    raise CannotStart(f"cannot run the job in {job.cwd!r}: {e.strerror}") from None
                what = (f"gmux-launch with gmuxd's interpreter {sys.executable}" if e.filename == sys.executable
                        else repr(job.argv[0]))
                raise CannotStart(f"could not start {what}: {e}") from None
        self.children[p.pid] = p
        return p.pid

    def ended(self, job: Job) -> Optional[tuple[str, Optional[int], str]]:
        """(state, exit status, what happened) if the job's process has ended, else None."""
        p = self.children.get(job.pid)
        if p is not None:
            rc = p.poll()
            if rc is None:
                return None
            del self.children[job.pid]
            record = self._exit_record(job)
            _last_step(job, record)
            return describe(rc, record)
        if alive(job.pid, job.starttime):
            return None
        record = self._exit_record(job)
        if record is not None:
            _last_step(job, record)
            return describe(record.get("status", 1), record)
        return ("lost", None, f"process {job.pid} ended without an exit record: killed by a signal from outside "
                              f"gmux (kill, the OOM killer) or crashed hard")

    def reap_others(self, live: set) -> None:
        """Reaps the processes no live job stands for: a job that said it was ending (bye) is finished before its
        process exits, so ended() is never asked about it, and it would stay a zombie."""
        for pid, p in list(self.children.items()):
            if pid not in live and p.poll() is not None:
                del self.children[pid]
        self._end_groups_left()

    def _exit_record(self, job: Job) -> Optional[dict]:
        # a system daemon believes a record only if it is the job owner's own file in their directory
        return read_exit(self.rundir, job.id, job.uid) if self.system else read_exit(self.rundir, job.id)

    def stop(self, job: Job, again: bool = False) -> bool:
        """`again`: a job gmuxd stopped that someone continued in part (a shell's `fg` reaches its terminal's
        group, not a server in a session of its own): only its processes not stopped now. A stop sent to a
        stopped process would wait, pending, and cont() would take it for someone else's and never continue
        that process."""
        return self._signal_tree(job, signal.SIGSTOP, spare=_stopped if again else None)

    def cont(self, job: Job) -> bool:
        """Continues what gmuxd stopped, except a process that someone else stopped meanwhile (Ctrl-Z, `kill
        -STOP` while gmuxd held it): their stop waits, pending, and SIGCONT would discard it, undoing theirs. It
        stays stopped, theirs to continue; the rest of the job's processes (one in a session of its own, which
        their Ctrl-Z did not reach) go on. A process not yet stopped with a stop pending (in an uninterruptible
        wait as gmuxd stopped it) is continued: the stop pending is most likely gmuxd's."""
        return self._signal_tree(job, signal.SIGCONT, spare=_stopped_again)

    def stopped_outside(self, job: Job, signal_only: bool = False) -> bool:
        """Whether the job's process is stopped (by a signal or a debugger) although gmuxd did not stop it.
        `signal_only`: stopped by a signal (SIGSTOP, Ctrl-Z), not held for a moment by a tracer (py-spy pauses
        a job it samples, a hundred times a second)."""
        return self._identified(job) and _state(job.pid) in (("T",) if signal_only else ("T", "t"))

    def running(self, job: Job) -> bool:
        """Whether the job's process runs or sleeps (neither stopped, nor in a wait that a stop must outlast)."""
        return self._identified(job) and _state(job.pid) in ("R", "S")

    def _signal_tree(self, job: Job, sig: int, spare: Optional[Callable[[int], bool]] = None) -> bool:
        """`sig` to the job's group (or its process and descendants) and to its processes outside the group;
        `spare`: each process apart, none that it holds to, if it holds to any. A process of another user (a
        `sudo` child under a user's gmuxd) is passed over, never the end of the rest."""
        if not self._identified(job):
            return False
        try:
            leads = os.getpgid(job.pid) == job.pid
            tree = descendants(job.pid)
            others = self._outside_group(job, tree)
            if spare is not None:
                members = set(_group(job.pid) if leads else [job.pid, *tree]) | set(others)
                held = {pid for pid in members if spare(pid)}
                if held:
                    for pid in sorted(members - held):
                        with contextlib.suppress(ProcessLookupError, PermissionError):
                            os.kill(pid, sig)
                    return True
            if leads:
                with contextlib.suppress(PermissionError):
                    os.killpg(job.pid, sig)
            for pid in ([] if leads else [job.pid]) + others:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, sig)
            return True
        except ProcessLookupError:
            return False

    def _outside_group(self, job: Job, candidates: list) -> list:
        """The job's processes that a signal to its group misses: descendants in a group or session of their own
        (a server it started with setsid, a shell's job control), and processes that began with the job's marks in
        their environment, which an orphan keeps when its parent is gone (a daemon the job double-forked; any
        process once the job's own has exited). Under a system daemon, only those still the job's user's (a
        setuid program the job ran: its user could not signal it either). Never gmuxd itself (started, say, from
        a shell within a job, with its marks)."""
        marks = {f"GMUX_JOB_TOKEN={job.token}".encode()} if job.token else set()
        found = []
        uid = job.uid if self.system else os.getuid()
        for pid in set(candidates) | set(_marked(marks, job.id, self.rundir.root, uid)):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                if pid not in (job.pid, os.getpid()) and os.getpgid(pid) != job.pid and \
                        (not self.system or _real_uid(pid) == job.uid):
                    found.append(pid)
        return sorted(found)

    def _identified(self, job: Job) -> bool:
        # Only a process identified by pid *and* start time: never a reused pid, never on a bare pid's word;
        # under a system daemon, only while it runs as the job's owner (root signals nothing of anyone else's).
        return (job.pid > 1 and job.starttime is not None and alive(job.pid, job.starttime)
                and (not self.system or _real_uid(job.pid) == job.uid))

    def kill(self, job: Job, sig: int = signal.SIGKILL) -> bool:
        """The job and what it started (its loader's workers, a child it forked): killed alone, they would run
        on, unseen, holding memory."""
        return self._signal_tree(job, sig)

    def kill_together(self, jobs: list) -> list[str]:
        """`kill` for jobs that end as one (a gang's ranks): each one's process is stopped first, all at once, so
        that none sees another die and ends on its own account. (Each kill scans /proc for what the job started:
        a rank whose peer's connection reset under it ended "failed" with gloo's error before its own kill came.)
        For each job: "killed"; "ended" (nothing of it left to signal: gone, or its first thread a zombie while its
        others still end, so that ended() says None until it can be reaped); or "ending", on its way out (killed
        from outside, or failed), not signalled: that end is its own, reaped as it ends. (Its sockets close before
        it is a zombie: a peer can see it end, fail and be reaped first.)"""
        ending = [self._identified(job) and proc_exiting(job.pid) for job in jobs]
        for job, out in zip(jobs, ending):
            if not out and self._identified(job):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(job.pid, signal.SIGSTOP)
        return ["ending" if out else "killed" if self.kill(job) else "ended" for job, out in zip(jobs, ending)]

    def end_leftovers(self, job: Job) -> None:
        """What is left of a submitted job's process group once its process has ended (a child it forked and
        left running) is asked to end: the job is over. (The group keeps the job's pid as its id while any member
        lives, and a live group's id is never given to a new process.) A gmux-launch job's group is its shell's
        (a pipeline's other commands) and is left alone; what it left outside that group is the job's, ended as
        a submitted job's is. A process that said it was ending (bye) may still be writing its last files: its
        group is asked once it has exited (reap_others). Once the group is empty its id may go to a new process,
        whose group is then left alone."""
        if job.pid > 1:
            self.leaving[job.pid] = job
            self._end_groups_left()

    def _end_groups_left(self) -> None:
        """What is left of each ended job whose process has exited (a child of ours, or one re-attached after a
        restart), its group and the processes that escaped it, is sent SIGTERM, and SIGCONT so that one gmuxd
        had stopped with the job gets it; what is still there LEFTOVER_GRACE_S later is killed (one that ignores
        SIGTERM would run on unseen, outside time-slicing, writing into a log no longer trimmed)."""
        now = time.monotonic()
        for pid, job in list(self.leaving.items()):
            p = self.children.get(pid)
            if p.poll() is None if p is not None else alive(pid, job.starttime):
                continue
            del self.leaving[pid]
            self._signal_leftovers(job, (signal.SIGTERM, signal.SIGCONT))
            self.ending[pid] = (job, now + LEFTOVER_GRACE_S)
        for pid, (job, deadline) in list(self.ending.items()):
            if now >= deadline:
                del self.ending[pid]
                self._signal_leftovers(job, (signal.SIGKILL,))

    def _signal_leftovers(self, job: Job, sigs: tuple) -> None:
        others = self._outside_group(job, []) + self._left_behind(job)
        # A new process that holds the job's pid means the job's group emptied and its id was given anew: the
        # group of that id is someone else's (a user's `setsid` landed there 10 s after a job ended, and was killed).
        ours = job.managed and proc_starttime(job.pid) in (None, job.starttime)
        for sig in sigs:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                if ours:
                    os.killpg(job.pid, sig)
            for other in others:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(other, sig)

    def _left_behind(self, job: Job) -> list[int]:
        """What the job's launcher, as it ended, said it left running outside its group (gmux.job.launch: with
        orphans kept in its tree, a daemon that cleared its environment too), each only while it is still that
        process (same start time) and the job's user's, never gmuxd itself or a process it started: the record
        is the job's word."""
        record = self._exit_record(job) or {}
        left = record.get("left")
        uid = job.uid if self.system else os.getuid()
        found = []
        for entry in left[:MAX_LEFT] if isinstance(left, list) else ():
            if not (isinstance(entry, list) and len(entry) == 2 and all(type(x) is int for x in entry)):
                continue
            pid, start = entry
            if pid > 1 and pid != os.getpid() and pid not in self.children and proc_starttime(pid) == start \
                    and _real_uid(pid) == uid:
                found.append(pid)
        return found


def _last_step(job: Job, record: Optional[dict]) -> None:
    """The job's step as its exit record gives it: a job that ended while gmuxd was away (restarting) sent its
    last report to nobody, and its STEP stayed at the last one heard. (The record is the user's: a number is
    all that is taken from it, and only a larger one.)"""
    step = (record or {}).get("step")
    if type(step) is int and job.step < step < 1 << 62:
        job.step = step


def describe(rc: int, record: Optional[dict]) -> tuple[str, Optional[int], str]:
    if rc < 0 and (record or {}).get("status") == 128 - rc:
        rc = 128 - rc       # gmux-launch said why the signal ended it (gmux.job.launch_signals), as a shell counts it
    if rc < 0:
        name = signal.Signals(-rc).name if -rc in signal.Signals._value2member_map_ else str(-rc)
        return ("killed", rc, f"killed by signal {-rc} ({name})")
    reason = (record or {}).get("reason") or ""
    if rc == 0:
        return ("exited", 0, reason or "finished")
    return ("failed", rc, f"exit status {rc}" + (f": {reason}" if reason else "") + "; see `gmux logs`")


def _real_uid(pid: int) -> Optional[int]:
    """The process's real uid (the first of /proc/PID/status's Uid: line); None if gone."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"Uid:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def _state(pid: int) -> str:
    """The process's state letter (field 3 of /proc/PID/stat); '' if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return ""
    rest = data[data.rfind(b")") + 2:].split()   # the command name may hold spaces and parentheses
    return rest[0].decode() if rest else ""


# SIGSTOP, SIGTSTP, SIGTTIN, SIGTTOU: a stop signal sent to a stopped process waits, pending, until SIGCONT.
_STOPS = sum(1 << (s - 1) for s in (signal.SIGSTOP, signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU))


def _stopped(pid: int) -> bool:
    return _state(pid) in ("T", "t")


def _stopped_again(pid: int) -> bool:
    """Stopped, with another stop pending: someone stopped it while gmuxd held it, or it was someone's stopped
    already when gmuxd stopped the job (gmuxd never stops again what it holds stopped: stop(again=True))."""
    return _state(pid) == "T" and _stop_pending(pid)


def _stop_pending(pid: int) -> bool:
    """Whether a stop signal waits for the process (/proc/PID/status: SigPnd, its own; ShdPnd, its group's)."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            return any(line.startswith((b"SigPnd:", b"ShdPnd:")) and int(line.split()[1], 16) & _STOPS
                       for line in f)
    except (OSError, ValueError, IndexError):
        return False


def _group(pgid: int) -> list[int]:
    """The processes of the process group (field 5 of /proc/PID/stat)."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    data = f.read()
                if int(data[data.rfind(b")") + 2:].split()[2]) == pgid:
                    found.append(int(name))
            except (OSError, ValueError, IndexError):
                continue
    return found


def _marked(marks: set, job_id: str, root: str, uid: int) -> list[int]:
    """The processes whose environment began with one of `marks`, or with both the job's id and its gmuxd's
    runtime dir (what gmux-launch leaves to every program the job executes). Only `uid`'s processes: another
    user's that carry the marks are not the job's."""
    id_mark = f"GMUX_JOB_ID={job_id}".encode()
    dir_marks = {f"GMUX_RUNTIME_DIR={r}".encode() for r in (root, os.path.realpath(root))}   # (rtB/, a symlink)
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            if os.stat(f"/proc/{name}").st_uid != uid:
                continue
        except OSError:
            continue
        env = started_environ(int(name))
        if env & marks or (id_mark in env and env & dir_marks):
            found.append(int(name))
    return found
