"""What a submitted job started ends with it: a child it forked and left, or one running when it is killed, also
one that left the job's process group."""
import contextlib
import time

import pytest

from gmux.rundir import started_environ
from gmux_testkit import proc_state

FORKER = """import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
open(sys.argv[1], "w").write(str(child.pid))
time.sleep(float(sys.argv[2]))
print("parent done")
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_child_a_job_left_running_ends_with_it_and_with_a_kill(node_factory, tmp_path):
    """A forked child outlived its job ("exited: finished") and even gmux shutdown --kill-jobs."""
    node = node_factory("--virtual-gpus", "1x1GiB")
    script = tmp_path / "forker.py"
    script.write_text(FORKER)
    for how, linger in (("exits", "0.5"), ("killed", "600")):
        pidfile = tmp_path / f"child-{how}"
        job = node.call("submit", argv=["python", str(script), str(pidfile), linger], cwd=str(tmp_path), env={},
                        name=how)["job"]
        node.wait_for(lambda: pidfile.exists() and pidfile.read_text(), 60, "the job's child to start")
        child = int(pidfile.read_text())
        if how == "killed":
            node.call("kill", job=job)
        node.wait_for(lambda: node.job(job)["state"] in ("exited", "killed", "failed"), 60, "the job to end")
        node.wait_for(lambda: not _alive(child), 10, f"the child a {how} job left to end")
        assert node.job(job)["state"] == ("exited" if how == "exits" else "killed")


# A server started in a session of its own (still the job's child), and a daemon that forked twice and started a
# session (an orphan: no longer anyone's descendant); a signal to the job's process group reaches neither. With
# "clear", a second such daemon also starts its program with an empty environment: no mark of the job is left.
ESCAPER = """import os, subprocess, sys, time
server = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
def daemon(env):
    r, w = os.pipe()
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            os.write(w, str(os.getpid()).encode())
            if env is None:
                time.sleep(600)
            os.execve(sys.executable, [sys.executable, "-c", "import time; time.sleep(600)"], env)
        os._exit(0)
    os.close(w)
    pid = int(os.read(r, 32))
    os.close(r)
    for _ in range(400):     # (until the forked parent between has exited: the daemon is an orphan)
        if os.waitpid(-1, os.WNOHANG) != (0, 0):
            break
        time.sleep(0.01)
    return pid
pids = [server.pid, daemon(None)] + ([daemon({})] if sys.argv[3:] == ["clear"] else [])
open(sys.argv[1] + ".part", "w").write(" ".join(map(str, pids)))
os.rename(sys.argv[1] + ".part", sys.argv[1])
print("pids", *pids, flush=True)
time.sleep(float(sys.argv[2]))
"""


def _pgid(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[2])


@pytest.mark.parametrize("how", ["killed", "exits"])
def test_what_left_the_jobs_process_group_ends_with_it(node_factory, tmp_path, how):
    """A job's setsid child and double-forked daemon ran on after `gmux kill` and after the job's end: only the
    job's process group was signalled. Later a daemon that also emptied its environment ran on: nothing marked it
    as the job's, and as an orphan it was no descendant of the job's process either."""
    node = node_factory("--virtual-gpus", "1x1GiB")
    script = tmp_path / "escaper.py"
    script.write_text(ESCAPER)
    pidfile = tmp_path / "pids"
    job = node.call("submit", argv=["python", str(script), str(pidfile), "0.5" if how == "exits" else "600",
                                    "clear"], cwd=str(tmp_path), env={}, name=how)["job"]
    node.wait_for(lambda: pidfile.exists(), 60, "the job's escaped processes to start")
    escaped = [int(p) for p in pidfile.read_text().split()]
    try:
        assert all(_pgid(p) != node.job(job)["pid"] for p in escaped)    # they did leave its group
        assert started_environ(escaped[2]) <= {b""}                        # and the last, every mark of it
        if how == "killed":
            node.call("kill", job=job)
        node.wait_for(lambda: node.job(job)["state"] in ("exited", "killed", "failed"), 60, "the job to end")
        for p in escaped:
            node.wait_for(lambda: not _alive(p), 10, f"escaped process {p} to end with its {how} job")
    finally:
        _kill_all(escaped)


def test_what_left_the_jobs_process_group_is_stopped_and_continued_with_it(tmp_path):
    """A job stopped for not yielding its GPU in time (SIGSTOP) computed on in its escaped processes; and a job of
    another runtime dir, or with another token, is not taken for it."""
    import os
    import subprocess
    import sys

    from gmux.node.jobs import Job
    from gmux.node.supervisor import Supervisor
    from gmux.rundir import RuntimeDir, proc_starttime
    rt = RuntimeDir(str(tmp_path / "rt"))
    procs, escaped = [], []
    try:
        # the job; another job of its gmuxd; a job of the same id under another gmuxd
        for n, marks in enumerate(({"GMUX_JOB_TOKEN": "mine"}, {"GMUX_JOB_TOKEN": "other", "GMUX_JOB_ID": "j2"},
                                   {"GMUX_JOB_ID": "j1", "GMUX_RUNTIME_DIR": "/elsewhere"})):
            env = {**os.environ, "GMUX_RUNTIME_DIR": rt.root, **marks}
            pidfile = tmp_path / f"pids{n}"
            procs.append(subprocess.Popen([sys.executable, "-c", ESCAPER, str(pidfile), "600"], env=env,
                                          start_new_session=True))
            for _ in range(600):
                if pidfile.exists():
                    break
                time.sleep(0.05)
            escaped.append([int(p) for p in pidfile.read_text().split()])
        leader = procs[0]
        job = Job("j1", "mine", "", ["python", "escaper.py"], pid=leader.pid,
                  starttime=proc_starttime(leader.pid), managed=True)
        sup = Supervisor(rt)
        assert sup.stop(job)
        for p in [leader.pid, *escaped[0]]:
            _wait(lambda: proc_state(p) == "T", f"process {p} of the job to be stopped")
        time.sleep(0.2)
        assert not any(proc_state(p) == "T" for p in [procs[1].pid, procs[2].pid, *escaped[1], *escaped[2]]), \
            "another job's process was stopped"
        assert sup.cont(job)
        for p in [leader.pid, *escaped[0]]:
            _wait(lambda: proc_state(p) not in ("T", ""), f"process {p} of the job to go on")
    finally:
        for p in procs:
            p.kill()
            p.wait()
        _kill_all([p for group in escaped for p in group])


def _wait(cond, what: str) -> None:
    for _ in range(200):
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _kill_all(pids: list) -> None:
    import os
    import signal
    for p in pids:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_a_job_that_said_bye_keeps_its_group_until_its_process_has_exited(tmp_path):
    """Finished on its bye, a job may still write its last files: its group is ended only once its process is
    gone, also for one a restarted gmuxd re-attached (not its child)."""
    import subprocess
    import sys

    from gmux.node.jobs import Job
    from gmux.node.supervisor import Supervisor
    from gmux.rundir import RuntimeDir, proc_starttime
    leader = subprocess.Popen([sys.executable, "-c", FORKER, str(tmp_path / "child"), "600"],
                              start_new_session=True)
    try:
        for _ in range(600):
            if (tmp_path / "child").exists() and (tmp_path / "child").read_text():
                break
            time.sleep(0.05)
        child = int((tmp_path / "child").read_text())
        job = Job("j1", "t", "", ["python", "forker.py"], pid=leader.pid, starttime=proc_starttime(leader.pid),
                  managed=True)
        sup = Supervisor(RuntimeDir(str(tmp_path / "rt")))
        sup.end_leftovers(job)
        sup.reap_others(set())
        time.sleep(0.3)
        assert leader.poll() is None and _alive(child)     # still finishing: nothing is signalled
        leader.kill()
        leader.wait()
        sup.reap_others(set())
        for _ in range(200):
            if not _alive(child):
                break
            time.sleep(0.05)
        assert not _alive(child)
    finally:
        leader.kill()
        leader.wait()


STUBBORN = """import os, signal, sys, time
if os.fork() == 0:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    open(sys.argv[1] + ".part", "w").write(str(os.getpid()))
    os.rename(sys.argv[1] + ".part", sys.argv[1])
    while True:
        time.sleep(0.05)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.05)
"""


@pytest.mark.parametrize("how", ["ignores SIGTERM", "was stopped with the job"])
def test_a_leftover_that_will_not_end_is_killed_after_a_grace(tmp_path, monkeypatch, how):
    """A child that ignored SIGTERM ran on after its job, unseen, writing into a log no longer trimmed; one that
    gmuxd had stopped with the job kept its SIGTERM pending, stopped for good, holding its memory."""
    import os
    import signal
    import subprocess
    import sys

    from gmux.node import supervisor
    from gmux.node.jobs import Job
    from gmux.node.supervisor import Supervisor
    from gmux.rundir import RuntimeDir, proc_starttime
    pidfile = tmp_path / "child"
    code = STUBBORN if how == "ignores SIGTERM" else FORKER
    leader = subprocess.Popen([sys.executable, "-c", code, str(pidfile), "600"], start_new_session=True)
    child = None
    try:
        _wait(lambda: pidfile.exists() and pidfile.read_text(), "the child to start")
        child = int(pidfile.read_text())
        job = Job("j1", "t", "", ["python", "x.py"], pid=leader.pid, starttime=proc_starttime(leader.pid),
                  managed=True)
        sup = Supervisor(RuntimeDir(str(tmp_path / "rt")))
        if how == "was stopped with the job":
            assert sup.stop(job)
            _wait(lambda: proc_state(child) == "T", "the child to be stopped with its job")
        monkeypatch.setattr(supervisor, "LEFTOVER_GRACE_S", 0.5 if how == "ignores SIGTERM" else 600.0, raising=False)
        leader.kill()
        leader.wait()
        sup.end_leftovers(job)
        sup.reap_others(set())
        if how == "ignores SIGTERM":
            time.sleep(0.3)
            assert _alive(child)            # asked, and given its grace
            time.sleep(0.4)
            sup.reap_others(set())
        _wait(lambda: not _alive(child), f"the child that {how} to end")
    finally:
        leader.kill()
        leader.wait()
        if child:
            _kill_all([child])


def test_a_new_process_given_an_ended_jobs_pid_is_never_signalled_for_it(tmp_path, monkeypatch):
    """The job's group emptied when it ended and its id went to a new process (a user's `setsid sleep`, made to
    land there): gmuxd, as root, killed that process's group 10 s after the job ended."""
    import os
    import subprocess

    from gmux.node import supervisor
    from gmux.node.jobs import Job
    from gmux.node.supervisor import Supervisor
    from gmux.rundir import RuntimeDir, proc_starttime
    if not os.access("/proc/sys/kernel/ns_last_pid", os.W_OK):
        pytest.skip("needs root's /proc/sys/kernel/ns_last_pid to give a new process an ended job's pid")
    ended = subprocess.Popen(["sleep", "0.2"], start_new_session=True)
    job = Job("j1", "t", "", ["sleep"], pid=ended.pid, starttime=proc_starttime(ended.pid), managed=True)
    ended.wait()
    sup = Supervisor(RuntimeDir(str(tmp_path / "rt")))
    new = None
    for _ in range(50):         # (another process may take the pid first: try again)
        with open("/proc/sys/kernel/ns_last_pid", "w") as f:
            f.write(str(job.pid - 1))
        new = subprocess.Popen(["sleep", "60"], start_new_session=True)
        if new.pid == job.pid:
            break
        new.kill()
        new.wait()
    if new.pid != job.pid:
        pytest.skip(f"no new process got pid {job.pid} in 50 tries")
    try:
        monkeypatch.setattr(supervisor, "LEFTOVER_GRACE_S", 0.0, raising=False)
        sup.end_leftovers(job)          # SIGTERM and SIGCONT to what is left, and at once (no grace) SIGKILL
        sup.reap_others(set())
        time.sleep(0.3)
        assert new.poll() is None and os.getpgid(new.pid) == job.pid
    finally:
        new.kill()
        new.wait()


@pytest.mark.parametrize("owner", ["the user's gmuxd", "a system gmuxd"])
def test_what_an_exit_record_says_was_left_is_ended_only_where_it_is_still_the_jobs(tmp_path, monkeypatch, owner):
    """The record's list of what the job left running is the job's word: gmuxd ends only a listed process that is
    still the one listed (same start time) and the job's user's; never itself, another user's, or a process that
    took a listed pid; junk entries are passed over."""
    import json
    import os
    import subprocess

    from gmux.node import supervisor
    from gmux.node.jobs import Job
    from gmux.node.supervisor import Supervisor
    from gmux.rundir import RuntimeDir, proc_starttime
    system = owner == "a system gmuxd"
    if system and os.geteuid() != 0:
        pytest.skip("a system gmuxd's check of the owner needs root")
    uid = 65534 if system else os.getuid()
    as_owner = {"user": uid} if system else {}
    rt = RuntimeDir(str(tmp_path / "rt"))
    rt.create(group=0 if system else None)
    left = subprocess.Popen(["sleep", "60"], start_new_session=True, **as_owner)      # the job's: ended
    other = subprocess.Popen(["sleep", "60"], start_new_session=True)                 # the test's own (root's)
    ended = subprocess.Popen(["sleep", "0.1"], start_new_session=True, **as_owner)
    job = Job("j1", "t", "", ["sleep"], pid=ended.pid, starttime=proc_starttime(ended.pid), managed=True, uid=uid)
    ended.wait()
    record = {"status": 0, "reason": "finished", "left": [
        [left.pid, proc_starttime(left.pid)], [os.getpid(), proc_starttime(os.getpid())],
        [other.pid, proc_starttime(other.pid) + 1], "x", [1], [2, 3, 4], {"a": 1}, [True, False], [3.5, 1]]}
    if system:
        record["left"].append([other.pid, proc_starttime(other.pid)])     # another user's
    path = rt.exit_file("j1", uid if system else None)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(record, f)
    if system:
        os.chown(path, uid, -1)
    try:
        monkeypatch.setattr(supervisor, "LEFTOVER_GRACE_S", 0.0, raising=False)
        sup = Supervisor(rt, system=system)
        sup.end_leftovers(job)
        sup.reap_others(set())
        _wait(lambda: left.poll() is not None, "the listed process the job left to end")
        time.sleep(0.2)
        assert other.poll() is None and _alive(os.getpid())
    finally:
        for p in (left, other):
            p.kill()
            p.wait()


@contextlib.contextmanager
def _stopped_escaper(tmp_path):
    """A job of ESCAPER's (a group of its own, a server in a session of its own, a double-forked daemon) that a
    Supervisor has stopped whole: (the supervisor, the job, its process, the escaped processes' pids)."""
    import os
    import subprocess
    import sys

    from gmux.node.jobs import Job
    from gmux.node.supervisor import Supervisor
    from gmux.rundir import RuntimeDir, proc_starttime
    pidfile = tmp_path / "pids"
    leader = subprocess.Popen([sys.executable, "-c", ESCAPER, str(pidfile), "600"], start_new_session=True,
                              env={**os.environ, "GMUX_JOB_TOKEN": "mine"})
    escaped = []
    try:
        _wait(lambda: pidfile.exists(), "the job's processes to start")
        escaped = [int(p) for p in pidfile.read_text().split()]
        job = Job("j1", "mine", "", ["python", "escaper.py"], pid=leader.pid,
                  starttime=proc_starttime(leader.pid), managed=True)
        sup = Supervisor(RuntimeDir(str(tmp_path / "rt")))
        assert sup.stop(job)
        for p in [leader.pid, *escaped]:
            _wait(lambda: proc_state(p) == "T", f"process {p} of the job to be stopped")
        yield sup, job, leader.pid, escaped
    finally:
        leader.kill()
        leader.wait()
        _kill_all(escaped)


def test_a_continue_leaves_stopped_what_someone_else_stopped_meanwhile(tmp_path):
    """Ctrl-Z (SIGTSTP to the job's group) while gmuxd held the job stopped: the group stays stopped when gmuxd
    continues the job, and the job's server in a session of its own, which no Ctrl-Z reached, goes on."""
    import os
    import signal
    with _stopped_escaper(tmp_path) as (sup, job, leader, escaped):
        os.killpg(leader, signal.SIGTSTP)          # the user's Ctrl-Z, to the job's group
        assert sup.cont(job)
        for p in escaped:
            _wait(lambda: proc_state(p) not in ("T", ""), f"escaped process {p} to go on")
        time.sleep(0.3)
        assert proc_state(leader) == "T"
        os.killpg(leader, signal.SIGCONT)          # the user's fg
        _wait(lambda: proc_state(leader) not in ("T", ""), "the job to go on once its user continued it")


def test_a_job_continued_in_part_and_stopped_again_is_continued_whole_at_its_turn(tmp_path):
    """A shell's `fg` continued the job's group while gmuxd held it; gmuxd stopped it again (check_frozen), and
    its second SIGSTOP, pending on the server in a session of its own that was still stopped, was taken at the
    job's turn for its user's stop: the server stayed stopped for ever."""
    import os
    import signal
    with _stopped_escaper(tmp_path) as (sup, job, leader, escaped):
        os.killpg(leader, signal.SIGCONT)          # the user's fg: their group only
        _wait(lambda: sup.running(job), "the job's process to go on")
        assert sup.stop(job, again=True)           # (what check_frozen does)
        _wait(lambda: proc_state(leader) == "T", "the job's process stopped again")
        assert sup.cont(job)                       # its turn
        for p in [leader, *escaped]:
            _wait(lambda: proc_state(p) not in ("T", ""), f"process {p} of the job to go on at its turn")


def test_a_process_of_another_user_in_the_tree_does_not_end_the_signalling_of_the_rest(tmp_path, monkeypatch):
    """Under a user's gmuxd, a job's `sudo` child (another uid) raised PermissionError out of the walk: a kill
    left the job's processes after it alive, a continue left them stopped."""
    import os
    import signal
    import subprocess
    import sys

    from gmux.node import supervisor
    from gmux.node.jobs import Job
    from gmux.rundir import RuntimeDir, proc_starttime
    kids = "import subprocess, sys, time\n" + "".join(
        f"c{i} = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n" for i in range(3)) + \
        "print(c0.pid, c1.pid, c2.pid, flush=True)\ntime.sleep(600)\n"
    parent = subprocess.Popen([sys.executable, "-c", kids], stdout=subprocess.PIPE, text=True)   # not a group leader
    children = [int(p) for p in parent.stdout.readline().split()]
    try:
        job = Job("j1", "mine", "", ["python", "kids.py"], pid=parent.pid, starttime=proc_starttime(parent.pid),
                  managed=False)
        theirs = min(children)          # signalled first: the others come after it
        real_kill = os.kill

        def kill(pid, sig):
            if pid == theirs:
                raise PermissionError(1, "Operation not permitted")
            real_kill(pid, sig)
        monkeypatch.setattr(supervisor.os, "kill", kill)
        sup = supervisor.Supervisor(RuntimeDir(str(tmp_path / "rt")))
        assert sup.kill(job, signal.SIGKILL)
        monkeypatch.undo()
        _wait(lambda: parent.poll() is not None, "the job's process to be killed")
        for p in set(children) - {theirs}:
            _wait(lambda: not _alive(p), f"the job's child {p} after the other user's to be killed")
    finally:
        parent.kill()
        parent.wait()
        _kill_all(children)


def test_what_a_gmux_launch_job_left_outside_its_shells_group_ends_with_it(node_factory, tmp_path):
    """A review: the launcher of a job run from a terminal listed what the job left running outside its group (a
    server in a session of its own, a double-forked daemon that cleared its environment), and gmuxd never read
    the list: they ran on, outside time-slicing, after the job's end. The terminal's group itself (a pipeline's
    other commands) is the shell's, and is left alone."""
    import subprocess

    from gmux_testkit import PY, ROOT, env
    node = node_factory("--virtual-gpus", "1x1GiB")
    script = tmp_path / "escaper.py"
    script.write_text(ESCAPER)
    pidfile = tmp_path / "pids"
    sibling = subprocess.Popen([PY, "-c", "import time; time.sleep(600)"], process_group=0)
    escaped = []
    try:            # the launcher joins the sibling's group, as a pipeline's second command joins the first's
        launcher = subprocess.Popen([PY, "-m", "gmux.cli.launch", "--runtime-dir", node.rt, "--name", "fg", "--",
                                     "python", str(script), str(pidfile), "1", "clear"], cwd=ROOT, env=env(),
                                    process_group=sibling.pid)
        node.wait_for(lambda: pidfile.exists(), 60, "the job's escaped processes to start")
        escaped = [int(p) for p in pidfile.read_text().split()]
        assert launcher.wait(60) == 0
        node.wait_for(lambda: next(j for j in node.ps()["jobs"] if j["name"] == "fg")["state"] == "exited", 30,
                      "the job to end")
        for p in escaped:
            node.wait_for(lambda: not _alive(p), 15, f"escaped process {p} to end with the job")
        time.sleep(0.5)
        assert sibling.poll() is None, "the shell's group was signalled"
    finally:
        _kill_all(escaped)
        sibling.kill()
        sibling.wait()


FORKS = """import os, sys, time
child = os.fork()
if child == 0:
    time.sleep(600)
    os._exit(0)
open(sys.argv[1] + ".part", "w").write(str(child))
os.rename(sys.argv[1] + ".part", sys.argv[1])
"""


def test_a_child_a_gmux_launch_job_forked_in_its_shells_group_ends_with_it(node_factory, tmp_path):
    """A child the script os.fork()ed ran on after the job's end ("exited: finished"): it stays in the shell's group,
    which gmuxd leaves alone, and a fork carries none of the job's marks in its starting environment. The shell's
    group itself (a pipeline's other commands) is still left alone."""
    import subprocess

    from gmux_testkit import PY, ROOT, env
    node = node_factory("--virtual-gpus", "1x1GiB")
    script = tmp_path / "forks.py"
    script.write_text(FORKS)
    pidfile = tmp_path / "pid"
    sibling = subprocess.Popen([PY, "-c", "import time; time.sleep(600)"], process_group=0)
    forked = None
    try:
        launcher = subprocess.Popen([PY, "-m", "gmux.cli.launch", "--runtime-dir", node.rt, "--name", "fk", "--",
                                     "python", str(script), str(pidfile)], cwd=ROOT, env=env(),
                                    process_group=sibling.pid)
        assert launcher.wait(60) == 0
        forked = int(pidfile.read_text())
        node.wait_for(lambda: next(j for j in node.ps()["jobs"] if j["name"] == "fk")["state"] == "exited", 30,
                      "the job to end")
        node.wait_for(lambda: not _alive(forked), 15, f"the job's forked child {forked} to end with it")
        time.sleep(0.5)
        assert sibling.poll() is None, "the shell's group was signalled"
    finally:
        _kill_all([forked] if forked else [])
        sibling.kill()
        sibling.wait()


def test_gmuxd_never_signals_itself_when_it_carries_a_jobs_marks(tmp_path):
    """A gmuxd started from a shell inside a job carries that job's marks (GMUX_JOB_ID, GMUX_RUNTIME_DIR) in its
    starting environment: killing the job killed gmuxd too."""
    import os
    import subprocess
    import sys
    rt = str(tmp_path / "rt")
    daemon = f"""import subprocess, sys
from gmux.node.jobs import Job
from gmux.node.supervisor import Supervisor
from gmux.rundir import RuntimeDir, proc_starttime
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
job = Job("j1", "tok", "", ["python", "t.py"], pid=child.pid, starttime=proc_starttime(child.pid), managed=True)
assert Supervisor(RuntimeDir({rt!r})).kill(job)
print("returncode", child.wait(), flush=True)
"""
    out = subprocess.run([sys.executable, "-c", daemon], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "GMUX_JOB_ID": "j1", "GMUX_RUNTIME_DIR": rt})
    assert out.returncode == 0 and "returncode -9" in out.stdout, (out.returncode, out.stdout, out.stderr)


PEER = "import os, sys\nos.read(int(sys.argv[1]), 1)\nos._exit(1)\n"     # a rank whose peer's end closes under it


def test_ranks_killed_together_are_all_killed_none_ends_on_its_own_account(tmp_path):
    """gmux kill of a gang: a rank saw its peer killed (its connection reset) and ended "failed" with that error
    before its own kill came, since each kill first scans /proc for what the job started (CI, a torchrun gang)."""
    import os
    import signal
    import subprocess
    import sys

    from gmux.node.jobs import Job
    from gmux.node.supervisor import Supervisor
    from gmux.rundir import RuntimeDir, proc_starttime
    for attempt in range(5):
        read, write = os.pipe()
        first = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], pass_fds=(write,))
        peer = subprocess.Popen([sys.executable, "-c", PEER, str(read)], pass_fds=(read,))
        os.close(read)
        os.close(write)
        try:
            time.sleep(0.5)
            jobs = [Job(f"j{n}", f"t{n}", "", ["python", "rank.py"], pid=p.pid, starttime=proc_starttime(p.pid))
                    for n, p in enumerate((first, peer))]
            assert Supervisor(RuntimeDir(str(tmp_path / "rt"))).kill_together(jobs) == ["killed", "killed"]
            assert (first.wait(30), peer.wait(30)) == (-signal.SIGKILL, -signal.SIGKILL), f"attempt {attempt}"
        finally:
            for p in (first, peer):
                p.kill()
                p.wait()


def test_a_rank_already_on_its_way_out_is_not_killed_for_its_peer(tmp_path, monkeypatch):
    """kill -9 of rank 1 (CI, loaded): its sockets closed before it was a zombie, rank 0 saw its connection reset,
    failed, and was reaped first; gmuxd then killed rank 1 "for its peer", and said so, where it had been killed
    from outside. A process the kernel is ending (PF_EXITING) is said "ending", neither stopped nor signalled: its
    own end is reaped and told. (Ending, a 3 GB process shows the flag for about 0.25 s here.)"""
    import os
    import subprocess
    import sys

    from gmux.node import supervisor
    from gmux.node.jobs import Job
    from gmux.rundir import RuntimeDir, _stat_after_name, exiting_from_stat, proc_starttime
    procs = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"]) for _ in range(2)]
    try:
        time.sleep(0.3)
        jobs = [Job(f"j{n}", f"t{n}", "", ["python", "rank.py"], pid=p.pid, starttime=proc_starttime(p.pid))
                for n, p in enumerate(procs)]
        assert not exiting_from_stat(_stat_after_name(procs[1].pid))
        monkeypatch.setattr(supervisor, "proc_exiting", lambda pid: pid == procs[1].pid)
        assert supervisor.Supervisor(RuntimeDir(str(tmp_path / "rt"))).kill_together(jobs) == ["killed", "ending"]
        assert procs[0].wait(30) == -9
        time.sleep(0.2)
        assert procs[1].poll() is None and _stat_after_name(procs[1].pid)[0] == b"S"    # (not stopped either)
    finally:
        for p in procs:
            p.kill()
            p.wait()
    fields = _stat_after_name(os.getpid())
    flagged = [fields[0], *fields[1:6], str(int(fields[6]) | 0x4).encode(), *fields[7:]]
    assert exiting_from_stat(flagged) and not exiting_from_stat([b"Z", *flagged[1:]])
    assert not exiting_from_stat(fields[:3]) and not exiting_from_stat(None)


LEADER_GONE = """import ctypes, sys, threading, time
threading.Thread(target=time.sleep, args=(600,)).start()
sys.stdin.readline()
ctypes.CDLL(None).syscall(60, 0)      # SYS_exit (x86-64): this thread alone, the process lives on
"""


def test_a_process_whose_first_thread_has_exited_is_ended_for_a_kill_yet_cannot_be_reaped(tmp_path):
    """The state a killed rank is in while its threads end one by one: its first thread a zombie (nothing to
    signal, `kill_together` says "ended"), the process not yet to be reaped (`ended` says None). gmuxd must wait
    for its end there, not tell one of its own (test_exclusive: ...not_yet_reapable...)."""
    import platform
    import subprocess
    import sys

    from gmux.node.jobs import Job
    from gmux.node.supervisor import Supervisor
    from gmux.rundir import RuntimeDir, _stat_after_name, proc_starttime
    if platform.machine() != "x86_64":
        pytest.skip("the exit syscall's number is x86-64's")
    p = subprocess.Popen([sys.executable, "-c", LEADER_GONE], stdin=subprocess.PIPE)
    try:
        job = Job("j1", "t1", "", ["python", "rank.py"], pid=p.pid, starttime=proc_starttime(p.pid))
        sup = Supervisor(RuntimeDir(str(tmp_path / "rt")))
        sup.children[p.pid] = p
        assert job.starttime is not None and sup.ended(job) is None
        p.stdin.write(b"go\n")
        p.stdin.flush()
        deadline = time.monotonic() + 30
        while _stat_after_name(p.pid)[0] != b"Z":
            assert time.monotonic() < deadline, _stat_after_name(p.pid)
            time.sleep(0.01)
        assert sup.kill_together([job]) == ["ended"]
        assert sup.ended(job) is None and p.poll() is None
    finally:
        p.kill()
        p.wait()
