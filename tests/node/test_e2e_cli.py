"""The gmux CLI against a real gmuxd: listings with --json, suspend/resume/kill/logs, helpful errors, metrics."""
import json
import os
import signal
import socket
import subprocess
import urllib.request

from gmux.rundir import RuntimeDir
from node_harness import PY, ROOT, TRAIN, env, jobs_under


def gmux(rt, *args, timeout=60, text=True, cwd=ROOT):
    return subprocess.run([PY, "-m", "gmux.cli.gmux", "--runtime-dir", rt, *args], env=env(), cwd=cwd,
                          capture_output=True, text=text, timeout=timeout)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_daemon_not_running_says_how_to_start_it(tmp_path):
    out = gmux(str(tmp_path / "nowhere"), "ps")
    assert out.returncode == 1
    assert "gmuxd is not running" in out.stderr and "gmuxd --runtime-dir" in out.stderr
    launch = subprocess.run([PY, "-m", "gmux.cli.launch", "--runtime-dir", str(tmp_path / "nowhere"), "--",
                             "python", f"{TRAIN}", "x", "1"], env=env(), cwd=ROOT, capture_output=True,
                            text=True, timeout=60)
    assert launch.returncode == 2 and "Start it with `gmuxd" in launch.stderr


def test_the_help_lists_every_command(tmp_path):
    said = gmux(str(tmp_path / "nowhere"), "--help").stdout
    assert all(f"    {cmd} " in said for cmd in ("ps", "submit", "decisions", "keys")), said   # (keys was left out)


def test_cli_controls_a_submitted_job_and_metrics(node_factory, tmp_path):
    port = free_port()
    # (a generous deadline: a job slowed past the 1 s default on a loaded machine is stopped, and the reply to
    # its suspend is then a stop's, which this test does not check)
    node = node_factory("--virtual-gpus", "1x1GiB", "--quantum", "1", "--metrics-port", str(port),
                        "--deadline-floor", "20")
    sub = gmux(node.rt, "--json", "submit", "--name", "demo1", "--weight", "2", "--", PY, f"{TRAIN}",
               str(tmp_path / "o.json"), "1000000", "--attach", "--sleep", "0.01")
    assert sub.returncode == 0, sub.stderr
    job = json.loads(sub.stdout)["job"]
    node.wait_for(lambda: node.job(job)["state"] == "running" and node.job(job)["step"] > 0, 60, "job running")
    # The same name again while it runs is refused (a submit repeated after a timeout would run the script twice)
    again = gmux(node.rt, "submit", "--name", "demo1", "--", PY, f"{TRAIN}", str(tmp_path / "o2.json"), "5")
    assert again.returncode == 1 and f"your job {job} named 'demo1' has not ended (running)" in again.stderr, again.stderr
    ps = json.loads(gmux(node.rt, "--json", "ps").stdout)
    (j,) = ps["jobs"]
    assert j["name"] == "demo1" and j["weight"] == 2 and j["managed"] and "token" not in j
    table = gmux(node.rt, "ps").stdout
    assert job in table and "running" in table
    # suspend waits for the job's acknowledgement and says how long it took (the job named by its name)
    out = gmux(node.rt, "--json", "suspend", "demo1")
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout)
    # the job stamps the boundary at which it took the command: the wait for it is part of the job's latency
    assert 0 <= r["boundary_wait_s"] <= r["job_latency_s"] <= r["latency_s"]
    assert node.job(job)["state"] == "held"
    # (its rate now is none: it kept the last residency's, in `gmux ps` and the metrics, until it ran again)
    assert node.job(job)["rate_now"] is None and node.job(job)["rate_solo"], node.job(job)
    rates = next(line for line in gmux(node.rt, "ps").stdout.splitlines() if job in line)
    assert " -/" in rates, rates
    step = node.job(job)["step"]
    node.wait_for(lambda: node.job(job)["host_bytes"] > 0, 30, "suspended state measured")
    assert gmux(node.rt, "resume", job).returncode == 0
    node.wait_for(lambda: node.job(job)["step"] > step, 60, "training again after resume")
    running = f'gmux_job_state{{gpu="0",job="{job}",state="running"}} 1.0'
    scrape = lambda: urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    metrics = node.wait_for(lambda: (lambda m: running in m and m)(scrape()), 20, "the job's metrics")
    assert "gmux_job_suspends_total" in metrics and "gmux_gpu_memory_bytes" in metrics
    assert "gmux_host_held_bytes" in metrics and "gmux_internal_errors_total 0.0" in metrics
    logs = gmux(node.rt, "logs", job)
    assert logs.returncode == 0
    said = gmux(node.rt, "suspend", job).stdout
    assert said.startswith(f"suspended {job} in ") and "ms of it waiting for the mini-batch to end" in said, said
    node.wait_for(lambda: f'gmux_job_rate{{gpu="0",job="{job}"}} 0.0' in scrape(), 20, "no rate while held")
    kill = gmux(node.rt, "kill", job)
    assert kill.returncode == 0
    node.wait_for(lambda: node.job(job)["state"] == "killed", 20, "killed")
    assert node.job(job)["detail"] == "killed by gmux kill"
    again = gmux(node.rt, "suspend", job)
    assert again.returncode == 1 and "has ended" in again.stderr
    # (by its name as by its id: it said "no job 'demo1' (an id, or the name of a live job)")
    again = gmux(node.rt, "kill", "demo1")
    assert again.returncode == 1 and f"kill: job {job} named 'demo1' has ended (killed: killed by gmux kill)" in \
        again.stderr, again.stderr
    top = gmux(node.rt, "--json", "top", "--count", "1")
    assert top.returncode == 0 and json.loads(top.stdout.splitlines()[-1])["jobs"][0]["id"] == job
    dec = json.loads(gmux(node.rt, "--json", "decisions").stdout)["decisions"]
    assert any(d["kind"] == "end" and d["jobs"] == [job] for d in dec)


def test_a_job_that_ends_by_itself_is_reaped(node_factory, tmp_path):
    """A submitted job that finishes says so before it exits; gmuxd, its parent, must still reap it (no zombie)."""
    node = node_factory("--virtual-gpus", "1x1GiB")
    sub = gmux(node.rt, "--json", "submit", "--", PY, f"{TRAIN}", str(tmp_path / "o.json"), "20", "--attach")
    job = json.loads(sub.stdout)["job"]
    node.wait_for(lambda: node.job(job)["state"] == "exited", 60, "job finished")
    pid = node.job(job)["pid"]
    node.wait_for(lambda: not os.path.exists(f"/proc/{pid}"), 20, f"process {pid} reaped, not left a zombie")
    assert node.job(job)["step"] == 20     # its last step, not the one of its last report


def test_the_interpreter_options_of_a_submitted_command_are_its_processs_and_a_shell_script_is_refused(
        node_factory, tmp_path):
    """`python -W ignore train.py` was refused and `python -u` dropped; `-- ./run.sh` was accepted and failed in the
    job's log with a SyntaxError."""
    node = node_factory("--virtual-gpus", "1x1GiB")
    (tmp_path / "show.py").write_text("import json, sys, warnings\nwarnings.warn('loud')\n"
                                      "json.dump({'w': sys.warnoptions, 'x': sorted(sys._xoptions)}, "
                                      "open(sys.argv[1], 'w'))\n")
    sub = gmux(node.rt, "--json", "submit", "--", PY, "-u", "-W", "ignore", "-X", "faulthandler",
               str(tmp_path / "show.py"), str(tmp_path / "o.json"), cwd=str(tmp_path))
    assert sub.returncode == 0, sub.stderr
    job = json.loads(sub.stdout)["job"]
    node.wait_for(lambda: node.job(job)["state"] in ("exited", "failed"), 60, "the job to end")
    assert json.loads((tmp_path / "o.json").read_text()) == {"w": ["ignore"], "x": ["faulthandler"]}
    assert "loud" not in gmux(node.rt, "logs", job).stdout
    (tmp_path / "run.sh").write_text("#!/bin/sh\necho hi\n")
    os.chmod(tmp_path / "run.sh", 0o755)
    sub = gmux(node.rt, "submit", "--", "./run.sh", cwd=str(tmp_path))
    assert sub.returncode != 0 and "'./run.sh' is a script for '/bin/sh', not Python" in sub.stderr, sub.stderr


def test_raw_logs_are_the_bytes_the_job_wrote_and_plain_logs_stay_safe_for_a_terminal(node_factory, tmp_path):
    """`gmux logs --raw` showed every byte that is not UTF-8 as U+FFFD: gmuxd sent the log decoded as text. Raw, it
    is the log's bytes as written; without --raw its control characters are still shown escaped."""
    node = node_factory("--virtual-gpus", "1x1GiB")
    written = b"latin-1 \xe9t\xe9 \x1b[31mred\x1b[0m\rover\n\xff\xfe end\n"
    script = tmp_path / "bytes_job.py"
    script.write_text(f"import sys\nsys.stdout.buffer.write({written!r})\n")
    job = json.loads(gmux(node.rt, "--json", "submit", "--", PY, str(script)).stdout)["job"]
    node.wait_for(lambda: node.job(job)["state"] == "exited", 60, "job finished")
    with open(os.path.join(node.rt, "logs", f"{job}.log"), "rb") as f:
        log = f.read()
    assert written in log
    raw = gmux(node.rt, "logs", "--raw", job, text=False)
    assert raw.returncode == 0 and raw.stdout == log, raw
    last = gmux(node.rt, "logs", "--raw", "--tail", "1", job, text=False)
    assert last.returncode == 0 and last.stdout == log.splitlines(keepends=True)[-1], last
    shown = gmux(node.rt, "logs", job)
    assert shown.returncode == 0 and "\x1b" not in shown.stdout, shown
    assert "\\x1b[31mred\\x1b[0m\\x0dover" in shown.stdout and "\ufffd\ufffd end" in shown.stdout, shown.stdout


CARELESS = [  # (arguments, what the one-line refusal says)
    (["kill", ""], "kill: JOB: '' is not a valid name"),
    (["logs", "\x1b[31mRED"], "logs: JOB: '\\x1b[31mRED' is not a valid name"),
    (["suspend", "[/bogus]"], "suspend: JOB: '[/bogus]' is not a valid name"),
    (["submit", "--name", "", "--", "python", "x.py"], "--name: '' is not a valid name"),
    (["submit", "--ranks", "100", "--", "python", "x.py"], "submit: --ranks 100: this machine has 1 GPU (0)"),
    (["ps", "--limit", "99999999999999999999"], "ps: --limit: 99999999999999999999 is outside"),
    (["submit", "--mem", "0", "--", "python", "x.py"], "--mem: 0 is not a size > 0"),
    (["submit", "--mem", "5", "--", "python", "x.py"], "--mem: 5 would be 5 bytes: give a unit, e.g. 5GiB"),
    (["submit", "--mem", "-1GiB", "--", "python", "x.py"], "--mem: '-1GiB' is not a size"),   # (was: "expected one
                                                                                               # argument")
    (["submit", "--mem", "9" * 400, "--", "python", "x.py"], "is more memory than any machine has"),
    (["submit", "--weight", "nan", "--", "python", "x.py"], "--weight: nan is not a weight in [0.001, 1000]"),
    (["submit", "--weight", "-inf", "--", "python", "x.py"], "--weight: -inf is not a weight in [0.001, 1000]"),
    (["submit", "--weight", "5e-324", "--", "python", "x.py"], "--weight: 5e-324 is not a weight in [0.001, 1000]"),
    (["submit", "--gpu", "-1", "--", "python", "x.py"], "--gpu: -1 is not an integer >= 0"),
    (["submit", "--", "python", "missing.py"], "submit: no script 'missing.py' in"),
    (["submit", "--", "true"], "submit: a job is a Python training script"),
    (["submit", "--", "python", "-c", "print(1)"], "submit: a job runs a script or a module (-m), not python -c"),
    (["submit", "--", "python", "-m"], "submit: python -m needs a module name"),
    (["submit", "--", "python", "-i", "x.py"], "submit: python -i: a job runs unattended"),
    (["top", "--interval", "nan"], "--interval: nan is not a number of seconds > 0 and at most 1,000,000"),
    (["top", "--interval", "1e300", "--count", "2"], "--interval: 1e300 is not a number of seconds > 0"),  # (was a
                                                                # traceback from time.sleep after the first table)
    (["logs", "j1", "--tail", "-5"], "--tail: -5 is not an integer >= 0"),
    (["decisions", "--limit", "-1"], "--limit: -1 is not a positive integer"),
    (["decisions", "--limit", "9" * 20], f"decisions: --limit: {'9' * 20} is outside [1, 100000]"),   # (was [0, 2**62])
]


def test_careless_arguments_get_one_line_that_names_the_problem(node_factory, tmp_path):
    """Values the wire format refuses used to reach the user as a ProtocolError traceback, and numbers argparse
    let through as a traceback from deep inside (time.sleep, int(inf)); each is now one line, exit 1 or 2."""
    node = node_factory("--virtual-gpus", "1x1GiB")
    script = tmp_path / "x.py"      # there, so that each refusal is for the argument it names
    script.write_text("pass\n")
    for args, needle in CARELESS:
        out = gmux(node.rt, *[str(script) if a == "x.py" else a for a in args], timeout=30)
        assert out.returncode in (1, 2) and "Traceback" not in out.stderr, (args, out.stderr)
        assert needle in out.stderr and "\x1b" not in out.stderr, (args, out.stderr)
    for spec, needle in (("1x0", "at least 1MiB"), ("2x", "say each virtual GPU's memory too, e.g. 2x16GiB"), ("9" * 400 + "GiB", "more memory")):
        out = subprocess.run([PY, "-m", "gmux.cli.gmuxd", "--runtime-dir", str(tmp_path / "bad"), "--virtual-gpus",
                              spec], env=env(), cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert out.returncode == 2 and needle in out.stderr and "Traceback" not in out.stderr, out.stderr


GMUXD_CARELESS = [
    # (argparse took a value starting with '-' for a flag: "expected one argument", where --mem -1GiB had its own
    # check's words; a flag of another mode was silently ignored)
    (["--host-budget", "-1GiB"], "gmuxd: error: argument --host-budget: '-1GiB' is not a size"),
    (["--log-limit", "-1GiB"], "gmuxd: error: argument --log-limit: '-1GiB' is not a size"),
    (["--socket-group", "gmux"], "gmuxd: error: --socket-group is for --system"),
    (["--name", "m1"], "gmuxd: error: --name is for cluster mode: it needs --scheduler tcp://HOST:PORT"),
    (["--keys", "keys"], "gmuxd: error: --keys is for cluster mode: it needs --scheduler tcp://HOST:PORT"),
]


def test_gmuxd_says_which_flag_is_wrong_and_why(tmp_path):
    for args, needle in GMUXD_CARELESS:
        out = subprocess.run([PY, "-m", "gmux.cli.gmuxd", "--runtime-dir", str(tmp_path / "rt"), *args], env=env(),
                             cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert out.returncode == 2 and needle in out.stderr, (args, out.stderr)
    assert not (tmp_path / "rt").exists()
    said = subprocess.run([PY, "-m", "gmux.cli.gmuxd", "--help"], env={**env(), "COLUMNS": "200"}, cwd=ROOT,
                          capture_output=True, text=True, timeout=60).stdout
    assert "0: every suspended job's state goes to disk" in said, said      # (what --host-budget 0 means)


def test_a_command_to_a_killed_gmuxd_fails_in_seconds(node_factory):
    """suspend, resume, kill and migrate wait up to 130 s for a job's boundary; against a gmuxd killed with -9
    (its socket file left behind) they waited all of it, where ps gave up after 5 s."""
    import time
    node = node_factory("--virtual-gpus", "1x1GiB")
    node.kill_daemon()
    t0 = time.monotonic()
    out = gmux(node.rt, "suspend", "j1", timeout=60)
    assert out.returncode == 1 and "gmuxd is not running at" in out.stderr, out.stderr
    assert time.monotonic() - t0 < 30


def test_a_slow_start_is_not_counted_as_suspend_time(node_factory, tmp_path):
    """SUSPENDS (s) is what suspends and resumes cost; the wait for a job's first boundary is its start-up."""
    node = node_factory("--virtual-gpus", "1x1GiB")
    slow = tmp_path / "slow_start.py"
    slow.write_text(f"import runpy, sys, time\ntime.sleep(3)\n"
                    f"sys.argv = [{str(TRAIN)!r}, {str(tmp_path / 'o.json')!r}, '1000000', '--attach', '--sleep', "
                    f"'0.01']\nrunpy.run_path(sys.argv[0], run_name='__main__')\n")
    job = json.loads(gmux(node.rt, "--json", "submit", "--", PY, str(slow)).stdout)["job"]
    node.wait_for(lambda: node.job(job)["step"] > 0, 60, "job training")
    info = node.job(job)
    assert info["suspends"] == 0 and info["suspend_seconds"] < 1, info


def test_a_submit_the_filesystem_refuses_leaves_nothing_behind(node_factory, tmp_path):
    """With gmuxd's runtime directory gone read-only, a submit could not open the job's log, then could not remove
    the job's (absent) spill file either: an internal error, and a job listed as waiting for ever. Here the job
    directories are replaced by files, which refuses the same writes to any user (root writes through modes)."""
    node = node_factory("--virtual-gpus", "2x1GiB")
    script = tmp_path / "x.py"
    script.write_text("pass\n")
    rt = RuntimeDir(node.rt)
    for d in (rt.logs(), rt.checkpoints()):
        os.rename(d, d + ".away")
        open(d, "w").close()
    out = gmux(node.rt, "submit", "--", "python", str(script))
    assert out.returncode == 1 and f"submit: cannot write {rt.log_file('j1')}: Not a directory" in out.stderr, \
        out.stderr
    assert node.ps()["jobs"] == []
    # A gang whose second rank's log cannot be written: its first rank, started already, is ended with it.
    for d in (rt.logs(), rt.checkpoints()):
        os.unlink(d)
        os.rename(d + ".away", d)
    os.mkdir(rt.log_file("j2"))
    out = gmux(node.rt, "submit", "--ranks", "2", "--name", "g", "--", "python", str(script))
    assert out.returncode == 1 and f"cannot write {rt.log_file('j2')}: Is a directory" in out.stderr, out.stderr
    assert node.ps()["jobs"] == []
    node.wait_for(lambda: not jobs_under(node.rt), 60, lambda: f"rank 0 left running: {jobs_under(node.rt)}")
    assert not os.path.exists(rt.log_file("j1"))     # rank 0's log, which the next j1 would have appended to
    os.rmdir(rt.log_file("j2"))
    job = json.loads(gmux(node.rt, "--json", "submit", "--", "python", str(script)).stdout)["job"]
    assert job == "j1"      # the refused submits' ids were given back
    node.wait_for(lambda: node.job(job)["state"] == "exited", 60, "the job submitted once writes work again")


def test_a_busy_gmuxd_is_never_said_to_be_down(node_factory):
    """Under about 70 clients at once, one `gmux ps` was told to start gmuxd, which ran, busy. A stopped gmuxd
    answers nothing, as a busy one: a request that waited for it in vain says that it runs, never to start it."""
    node = node_factory("--virtual-gpus", "1x1GiB")
    node.daemon.send_signal(signal.SIGSTOP)
    try:        # (both at once: each waits out its client's timeout)
        both = [subprocess.Popen([PY, "-m", *args], env=env(), cwd=ROOT, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
                for args in (["gmux.cli.gmux", "--runtime-dir", node.rt, "ps"],
                             ["gmux.cli.launch", "--runtime-dir", node.rt, "--", "python", TRAIN, "x", "1"])]
        said = [(p.communicate(timeout=120)[1], p.returncode) for p in both]
    finally:
        node.daemon.send_signal(signal.SIGCONT)
    for stderr, code in said:
        assert code in (1, 2), stderr
        assert f"gmuxd (pid {node.daemon.pid}) is running but did not answer" in stderr, stderr
        assert "Start it" not in stderr, stderr
    assert node.ps()["jobs"] == []      # (and it answers once continued)


def test_a_script_that_attaches_itself_under_the_hook_is_told_to_start_without_it(node_factory, tmp_path):
    """A script calling gmux.job.attach(), submitted with the hook (the default), shows CONTROL explicit, but it
    runs as it was started and cannot move in a new process; it was told to make it call attach(), which it did."""
    node = node_factory("--virtual-gpus", "2x1GiB")
    job = json.loads(gmux(node.rt, "--json", "submit", "--", PY, TRAIN, str(tmp_path / "o.json"), "1000000",
                          "--attach", "--sleep", "0.01").stdout)["job"]
    node.wait_for(lambda: node.job(job)["step"] > 0 and node.job(job)["report"].get("control") == "explicit", 60,
                  lambda: node.job(job))
    out = gmux(node.rt, "migrate", job, "--gpu", "1", "--new-process")
    assert out.returncode == 1 and "calls gmux.job.attach(), but was started with the transparent hook" in \
        out.stderr and "gmux submit --no-hook" in out.stderr, out.stderr
    # but it moves to the other GPU in its own process, which gmux ps says (it said nothing of a move)
    info = node.job(job)
    assert info["moves_in_process"] and not info["migratable"], info
    assert "explicit: suspend, free mem, move GPU" in gmux(node.rt, "ps").stdout
    node.call("kill", job=job)


def test_what_a_job_wrote_forges_no_line_and_output_into_pipes_and_files_is_whole(node_factory, tmp_path):
    """From a hostile-input review: a job's exit reason printed by `gmux decisions` kept its newlines (a forged
    decision line); `gmux logs JOB | head -1` ended with a BrokenPipeError traceback; `gmux top` into a file or a
    pipe wrote nothing; `gmux decisions --json` was refused (--json only before the command)."""
    from gmux_testkit import wait_for
    node = node_factory("--virtual-gpus", "1x1GiB")
    script = tmp_path / "forge.py"
    script.write_text("for i in range(20000):\n    print('line', i)\n"
                      "raise RuntimeError('oops\\n00:00:00 migrate  j9 moved to GPU 1: 3.2x faster')\n")
    job = json.loads(gmux(node.rt, "--json", "submit", "--", PY, str(script)).stdout)["job"]
    wait_for(lambda: node.job(job)["state"] == "failed", 60, lambda: node.job(job))
    decisions = gmux(node.rt, "decisions").stdout
    assert not any(line.startswith("00:00:00 migrate") for line in decisions.splitlines()), decisions
    assert "oops\\x0a00:00:00 migrate" in decisions, decisions
    assert json.loads(gmux(node.rt, "decisions", "--json").stdout)["decisions"]
    for args in (["logs", job], ["--json", "logs", job], ["--json", "top"], ["decisions"]):
        piped = subprocess.run(f"{PY} -m gmux.cli.gmux --runtime-dir {node.rt} {' '.join(args)} | head -c 10",
                               shell=True, env=env(), cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert len(piped.stdout) == 10 and "Traceback" not in piped.stderr and "Error" not in piped.stderr, \
            (args, piped.stderr)
    with open(tmp_path / "top.txt", "w") as f:
        assert subprocess.run([PY, "-m", "gmux.cli.gmux", "--runtime-dir", node.rt, "top", "--count", "2",
                               "--interval", "0.1"], env=env(), cwd=ROOT, stdout=f, timeout=60).returncode == 0
    assert (tmp_path / "top.txt").read_text().count("gmux top") == 2
    # A live job is listed above the ended one that came before it.
    (tmp_path / "sleeper.py").write_text("import time\ntime.sleep(120)\n")
    live = json.loads(gmux(node.rt, "--json", "submit", "--", PY, str(tmp_path / "sleeper.py")).stdout)["job"]
    shown = gmux(node.rt, "top", "--count", "1").stdout
    assert live != job and 0 <= shown.find(f"│ {live} ") < shown.find(f"│ {job} "), shown
    node.call("kill", job=live)


def test_gmuxd_takes_its_runtime_dir_absolute_and_refuses_another_programs_socket(tmp_path):
    """A relative --runtime-dir was handed as it was to the launchers of submitted jobs, which start in their
    submitter's directory: they never found gmuxd, and waited for ever. A socket another program listens on was
    taken over; an empty --runtime-dir quietly meant the default one."""
    from gmux_testkit import wait_for
    from gmux.wire.daemon_client import Client
    empty = subprocess.run([PY, "-m", "gmux.cli.gmuxd", "--runtime-dir", ""], env=env(), cwd=ROOT,
                           capture_output=True, text=True, timeout=60)
    assert empty.returncode == 2 and "--runtime-dir: an empty path" in empty.stderr, empty.stderr
    (tmp_path / "afile").write_text("")
    for command, code, needle in (
            (["gmux.cli.gmuxd", "--runtime-dir", str(tmp_path / "afile" / "sub")], 1, "is a file, not a directory"),
            (["gmux.cli.launch", "--gpu", "-1", "--", "python", "x.py"], 2, "--gpu: -1 is not an integer >= 0"),
            (["gmux.cli.scheduler", "--keys", str(tmp_path / "afile"), "--state", str(tmp_path / "s")], 2,
             "a file, not a directory")):       # (each said a raw "[Errno ...]" or named a wire field)
        out = subprocess.run([PY, "-m", *command], env=env(), cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert out.returncode == code and needle in out.stderr and "Errno" not in out.stderr, (command, out.stderr)
    os.mkdir(tmp_path / "taken", 0o700)
    other = socket.socket(socket.AF_UNIX)
    other.bind(str(tmp_path / "taken" / "gmuxd.sock"))
    other.listen()
    try:
        out = subprocess.run([PY, "-m", "gmux.cli.gmuxd", "--runtime-dir", str(tmp_path / "taken"),
                              "--virtual-gpus", "1x1GiB"], env=env(), cwd=ROOT, capture_output=True, text=True,
                             timeout=60)
        assert out.returncode == 1 and "another program serves" in out.stderr, out.stderr
    finally:
        other.close()
    (tmp_path / "elsewhere").mkdir()
    daemon = subprocess.Popen([PY, "-m", "gmux.cli.gmuxd", "--runtime-dir", "rel", "--virtual-gpus", "1x1GiB"],
                              env=env(), cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        rt = str(tmp_path / "rel")
        wait_for(lambda: os.path.exists(os.path.join(rt, "gmuxd.pid")), 30, "gmuxd up")
        script = tmp_path / "elsewhere" / "short.py"
        script.write_text("print('ran')\n")
        sub = subprocess.run([PY, "-m", "gmux.cli.gmux", "--runtime-dir", "../rel", "--json", "submit", "--", PY,
                              "short.py"], env=env(), cwd=tmp_path / "elsewhere", capture_output=True, text=True,
                             timeout=60)
        job = json.loads(sub.stdout)["job"]
        c = Client(rt, timeout=10)
        try:
            wait_for(lambda: next(j for j in c.call("ps")["jobs"] if j["id"] == job)["state"] == "exited", 60,
                     lambda: c.call("ps")["jobs"])
        finally:
            c.close()
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(30)
