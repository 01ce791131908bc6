"""gmux-launch in the foreground of a terminal: an interactive shell never sees the job stopped by gmuxd.

Before: gmuxd's SIGSTOP of a job out of its turn stopped gmux-launch itself, the shell's child. bash printed
"[1]+ Stopped", took the terminal back and made the job a background one (Ctrl-C no longer reached it); when the
shell exited, the job was killed by SIGHUP, and gmux said "lost ... (SIGKILL, the OOM killer)"."""
import os
import pty
import signal
import threading
import time

from gmux_testkit import PY, ROOT, env, proc_state

SPIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "spin_job.py")


def _drain(master: int) -> None:
    """The terminal's output, read as a terminal would (a full pty would block the job's prints)."""
    while True:
        try:
            if not os.read(master, 65536):
                return
        except OSError:
            return


def test_a_job_stopped_by_gmuxd_is_never_seen_stopped_by_the_shell_that_waits_for_it(node_factory):
    node = node_factory("--virtual-gpus", "1x1GiB")
    pid, master = pty.fork()     # the child: a session of its own, in its terminal's foreground, as a shell's job
    if pid == 0:
        os.chdir(ROOT)
        os.execve(PY, [PY, "-m", "gmux.cli.launch", "--runtime-dir", node.rt, "--name", "fg", "--", "python", SPIN],
                  env())
    threading.Thread(target=_drain, args=(master,), daemon=True).start()
    try:
        job = node.wait_for(lambda: next((j for j in node.ps()["jobs"] if j["name"] == "fg"), None), 60,
                            "the job registered")
        time.sleep(2.5)             # past the deadline of its first resume: a suspend stops it at once
        reply = node.call("suspend", job=job["id"])
        assert reply["kind"] == "stop", reply
        node.wait_for(lambda: proc_state(job["pid"]) == "T", 10, "the job stopped")
        time.sleep(0.5)
        assert os.waitpid(pid, os.WNOHANG | os.WUNTRACED) == (0, 0), "the shell's child was seen stopped"
        node.call("resume", job=job["id"])
        node.call("kill", job=job["id"])
        _, status = os.waitpid(pid, 0)
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, status    # it ends as the job did
    finally:
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
        os.close(master)


# A shell's job control, as bash does it: the command in a process group of its own, made the terminal's foreground;
# the shell lives on (so the terminal sends no SIGHUP when the command's process dies).
SHELL = """import os, signal, sys, time
signal.signal(signal.SIGTTOU, signal.SIG_IGN)
pid = os.fork()
if pid == 0:
    os.setpgid(0, 0)
    os.tcsetpgrp(0, os.getpid())
    os.execv(sys.argv[1], sys.argv[1:])
os.waitpid(pid, 0)
time.sleep(120)
"""


def test_a_job_whose_waiting_parent_is_killed_outright_ends_too(node_factory):
    """kill -9 of the process the shell waits for left the job training, orphaned, printing onto the terminal."""
    node = node_factory("--virtual-gpus", "1x1GiB")
    pid, master = pty.fork()
    if pid == 0:
        os.chdir(ROOT)
        os.execve(PY, [PY, "-c", SHELL, PY, "-m", "gmux.cli.launch", "--runtime-dir", node.rt, "--name", "orphan",
                       "--", "python", SPIN], env())
    threading.Thread(target=_drain, args=(master,), daemon=True).start()
    job = None
    try:
        job = node.wait_for(lambda: next((j for j in node.ps()["jobs"] if j["name"] == "orphan"), None), 60,
                            "the job registered")
        with open(f"/proc/{job['pid']}/stat") as f:
            waiter = int(f.read().rsplit(")", 1)[1].split()[1])
        assert waiter != pid        # (the shell's child, which forked the job)
        os.kill(waiter, signal.SIGKILL)
        node.wait_for(lambda: proc_state(job["pid"]) in ("", "Z"), 20, "the job to end with its parent")
    finally:
        for p in (pid, job and job["pid"]):
            try:
                if p:
                    os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass
        os.close(master)
