"""A signal that ends a job gmux-launch holds leaves a record that names it and when (gmux.job.launch_signals),
and takes nothing from the script: a handler installed below Python stays, and a second signal does not say
another reason over the first."""
import json
import os
import signal
import subprocess
import textwrap
import time

from gmux.rundir import RuntimeDir, read_exit
from gmux_testkit import PY, ROOT, env


def _run(tmp_path, body, timeout=60):
    """`body` run in a process of its own after `held = held_ends(...)` for job j1 in a runtime dir under
    tmp_path (nothing registered: held["agent"] stays None, as before registration)."""
    rt = RuntimeDir(str(tmp_path / "rt"))
    rt.create()
    script = textwrap.dedent('''
        import faulthandler, os, signal, sys, threading, time
        from gmux.job import launch_signals
        from gmux.rundir import RuntimeDir
        held = launch_signals.held_ends(RuntimeDir(sys.argv[1]), "j1", "/kept/j1.ckpt")
    ''') + textwrap.dedent(body)
    p = subprocess.run([PY, "-c", script, rt.root], env=env(), cwd=ROOT, capture_output=True, text=True,
                       timeout=timeout)
    return p, read_exit(rt, "j1")


def test_a_move_waiting_for_a_gmuxd_ended_by_sigterm_says_so(tmp_path):
    """A move's new process waits up to an hour for a gmuxd to register with, its state in a checkpoint: a SIGTERM
    there ended it with nothing said (Ctrl-C there already left a record naming the checkpoint)."""
    rt = RuntimeDir(str(tmp_path / "rt"))
    rt.create()
    with open(rt.pid_file, "w") as f:
        f.write("999999999 1")                # (a gmuxd that has ended: the launch says it waits for another)
    out = tmp_path / "out"
    (tmp_path / "train.py").write_text("print('never runs')\n")
    (tmp_path / "j1.ckpt").write_bytes(b"")     # (one not there ends the launch at once)
    with open(out, "wb") as log:
        p = subprocess.Popen([PY, "-m", "gmux.cli.launch", "--runtime-dir", rt.root, "--job", "j1", "--restore",
                              str(tmp_path / "j1.ckpt"), "--", "python", "train.py"],
                             env={**env(), "GMUX_JOB_TOKEN": "x"}, cwd=str(tmp_path),
                             stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while "waits for a gmuxd" not in out.read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "waits for a gmuxd" in out.read_text(), out.read_text()
        p.send_signal(signal.SIGTERM)
        assert p.wait(30) == -signal.SIGTERM
    finally:
        p.kill()
    said = f"ended by SIGTERM before it registered, which the script has no handler for; its state is kept in " \
           f"{tmp_path / 'j1.ckpt'}"
    assert read_exit(rt, "j1") == {"status": 143, "reason": said}
    assert "gmux-launch: job j1 got SIGTERM before it registered: it ends" in out.read_text()


def test_a_handler_installed_below_python_is_kept(tmp_path):
    """signal.getsignal says SIG_DFL for faulthandler's: a hold took SIGTERM over and gave back SIG_DFL, so the
    script's SIGTERM then ended it instead of dumping its stacks."""
    p, record = _run(tmp_path, '''
        faulthandler.register(signal.SIGTERM, chain=False)
        with held["while_waiting"]():
            pass
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.2)
        print("alive")
    ''')
    assert p.returncode == 0 and "alive" in p.stdout and "Current thread" in p.stderr, (p.stdout, p.stderr)
    assert record is None


def test_a_second_signal_while_the_first_ends_the_job_says_nothing_over_it(tmp_path):
    """Closing a terminal sends SIGHUP twice (the kernel's, and the one a foreground launch passes on), and
    torchrun may send SIGTERM after Ctrl-C: the second ran the handler again inside the first, with a second line,
    a second record over the first, and the second signal's death."""
    p, record = _run(tmp_path, '''
        real = launch_signals.write_exit
        def slow(*a, **k):
            time.sleep(1.0)
            real(*a, **k)
        launch_signals.write_exit = slow
        threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGTERM)).start()
        with held["while_waiting"]():
            os.kill(os.getpid(), signal.SIGHUP)
            time.sleep(10)
    ''')
    assert p.returncode == -signal.SIGHUP, (p.returncode, p.stderr)
    assert p.stderr.count("gmux-launch: job j1 got") == 1 and "got SIGHUP" in p.stderr, p.stderr
    assert record["status"] == 128 + signal.SIGHUP and record["reason"].startswith("ended by SIGHUP"), record
    assert json.dumps(record).count("SIGTERM") == 0


def test_gmuxd_reads_the_record_of_a_child_the_signal_ended():
    """A submitted job is gmuxd's child: it saw the signal's death and read no record, where a bye that had not
    arrived (a move had closed the agent) left only the record to say why."""
    from gmux.node.supervisor import describe
    said = "ended by SIGTERM during its move to a new process, which the script has no handler for"
    assert describe(-signal.SIGTERM, {"status": 143, "reason": said}) == \
        ("failed", 143, f"exit status 143: {said}; see `gmux logs`")
    assert describe(-signal.SIGKILL, {"status": 143, "reason": said})[0] == "killed"
    assert describe(-signal.SIGTERM, None) == ("killed", -15, "killed by signal 15 (SIGTERM)")
