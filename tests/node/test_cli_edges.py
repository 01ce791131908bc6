"""The gmux CLI's edges an outside tester found: Ctrl-C to a suspended gmux-launch, a log cut silently, errors
under --json, a subcommand's usage, the wire's field names and a gang's made-up id in errors, an empty detail for
a waiting job, job names in lookalike characters, a file given as the runtime directory. And what was left of
them: lookalike names refused by gmuxd itself, an unnamed gang's id taken from the jobs' numbering, a waiting job's
words worked out by the table alone, the cluster commands' errors under --json and their usage."""
import contextlib
import json
import os
import re
import signal
import subprocess
import time

import msgpack
import pytest
import torch

from gmux import protocol
from gmux.rundir import RuntimeDir

from node_harness import PY, ROOT, TRAIN, env


def gmux(rt, *args, timeout=60, environ=None):
    return subprocess.run([PY, "-m", "gmux.cli.gmux", "--runtime-dir", rt, *args], env=environ or env(), cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


def _held_and_queued(node_factory, tmp_path):
    """A gmuxd with a launched job it holds suspended and one waiting for its first turn (their processes and
    ids)."""
    node = node_factory("--virtual-gpus", "2x1GiB", "--deadline-floor", "20")    # (suspended, never SIGSTOPped)
    held = node.launch(TRAIN, str(tmp_path / "a.json"), "1000000", "--sleep", "0.01", log_name="held.log")
    job = node.job_of(held.pid)
    node.wait_for(lambda: node.job(job)["step"] > 2, 60, "training")
    node.call("suspend", job=job)
    node.wait_for(lambda: node.job(job)["state"] == "held", 30, "held")
    # (needs both GPUs to itself, and the held job keeps one: it waits in the queue, never started)
    queued = node.launch(TRAIN, str(tmp_path / "b.json"), "10", opts=["--gpus", "2"], log_name="queued.log")
    waiting = node.job_of(queued.pid)
    node.wait_for(lambda: node.job(waiting)["state"] == "waiting", 30, "queued")
    time.sleep(1.0)         # (its launcher has read gmuxd's reply to its registration: it waits for its turn)
    return node, held, job, queued, waiting


def test_ctrl_c_to_a_launch_waiting_on_gmuxd_ends_in_one_line(node_factory, tmp_path):
    """Ctrl-C reaching a job while gmuxd held it (suspended, or before its first turn) printed a traceback through
    ZeroMQ's poll; it ends in one line, with Ctrl-C's status as a running job's does, and says so in its record.
    A suspended script's own Ctrl-C handler is not run: its state is off the device, and a save there would write
    garbage over its last good checkpoint (a review found torch.save crash or write unreadable tensors)."""
    node, held, job, queued, waiting = _held_and_queued(node_factory, tmp_path)
    for proc, name, jid, when in ((queued, "queued.log", waiting, "before its first turn"),
                                  (held, "held.log", job, "while suspended by gmuxd")):
        os.kill(proc.pid, signal.SIGINT)
        assert proc.wait(60) == 130
        said = (tmp_path / name).read_text()
        assert "Traceback" not in said and f"gmux-launch: job {jid} interrupted {when}: it ends" in said, said
        node.wait_for(lambda: node.job(jid)["state"] == "failed", 20, "ended")
        assert node.job(jid)["detail"] == f"interrupted (SIGINT) {when}"
    # A script that saves its model on Ctrl-C: running, it does; suspended, its last good save is left as it was.
    script = tmp_path / "saves.py"
    script.write_text("import sys, time, torch\n"
                      "m = torch.nn.Linear(2, 1)\n"
                      "opt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
                      "try:\n"
                      "    while True:\n"
                      "        time.sleep(0.01)\n"
                      "        m(torch.ones(1, 2)).sum().backward()\n"
                      "        opt.step()\n"
                      "except KeyboardInterrupt:\n"
                      "    torch.save(m.state_dict(), sys.argv[1])\n"
                      "    raise\n")
    good = {"weight": torch.ones(1, 2), "bias": torch.zeros(1)}
    for suspended in (False, True):
        saved = tmp_path / f"saved-{suspended}.pt"
        torch.save(good, saved)
        saver = node.launch(str(script), str(saved), log_name=f"saver-{suspended}.log")
        jsaver = node.job_of(saver.pid)
        node.wait_for(lambda: node.job(jsaver)["step"] > 2, 60, "training")
        if suspended:
            node.call("suspend", job=jsaver)
        os.kill(saver.pid, signal.SIGINT)
        assert saver.wait(60) == 130
        said = (tmp_path / f"saver-{suspended}.log").read_text()
        mine = torch.load(saved)
        if suspended:
            assert "Traceback" not in said and "Ctrl-C handling is not run" in said, said
            assert all(torch.equal(mine[k], good[k]) for k in good), mine
        else:       # (its own KeyboardInterrupt, traceback and all, as under python)
            assert "KeyboardInterrupt" in said and not torch.equal(mine["weight"], good["weight"]), (said, mine)


def test_sigterm_to_a_held_launch_without_a_handler_ends_it_by_the_signal_with_a_record(node_factory, tmp_path):
    """torchrun, told Ctrl-C, sends its workers SIGTERM: a worker gmuxd held, whose script has no handler for it,
    died at once by the signal's default action and gmuxd called it "lost ... killed by a signal from outside
    gmux". It still dies by the signal (what its sender reads), now with a record that names it and when."""
    node, held, job, queued, waiting = _held_and_queued(node_factory, tmp_path)
    for proc, name, jid, sig, when in ((queued, "queued.log", waiting, signal.SIGHUP, "before its first turn"),
                                       (held, "held.log", job, signal.SIGTERM, "while suspended by gmuxd")):
        os.kill(proc.pid, sig)
        assert proc.wait(60) == -sig
        said = (tmp_path / name).read_text()
        assert f"gmux-launch: job {jid} got {sig.name} {when}: it ends" in said, said
        node.wait_for(lambda: node.job(jid)["state"] == "failed", 20, "ended")
        assert node.job(jid)["detail"] == f"ended by {sig.name} {when}, which the script has no handler for"
        assert node.job(jid)["exit_status"] == 128 + sig
    # Running, the signal's default action is the kernel's, at once (a handler would wait for a long native call)
    running = node.launch(TRAIN, str(tmp_path / "c.json"), "1000000", "--sleep", "0.01", log_name="running.log")
    jrun = node.job_of(running.pid)
    node.wait_for(lambda: node.job(jrun)["step"] > 2, 60, "training")
    os.kill(running.pid, signal.SIGTERM)
    assert running.wait(60) == -signal.SIGTERM
    assert "got SIGTERM" not in (tmp_path / "running.log").read_text()


# Ctrl-C lands exactly as the suspend has copied the state off the device and not yet answered, or as the resume
# starts: the script's handler would save the emptied tensors over its last good checkpoint.
MIDST = """import os, signal, sys, time, torch
from gmux.job.job import Job
def ctrl_c_within(name, after):
    real = getattr(Job, name)
    def patched(self, *a):
        if not after:
            os.kill(os.getpid(), signal.SIGINT)
        out = real(self, *a)
        if after:
            os.kill(os.getpid(), signal.SIGINT)
        return out
    setattr(Job, name, patched)
ctrl_c_within(sys.argv[2], sys.argv[2] == "suspend")
m = torch.nn.Linear(2, 1)
opt = torch.optim.SGD(m.parameters(), lr=0.1)
try:
    while True:
        time.sleep(0.01)
        m(torch.ones(1, 2)).sum().backward()
        opt.step()
except KeyboardInterrupt:
    torch.save(m.state_dict(), sys.argv[1])
    raise
"""


@pytest.mark.parametrize("within", ["suspend", "resume"])
def test_ctrl_c_in_the_midst_of_a_suspend_or_resume_runs_none_of_the_scripts_code(node_factory, tmp_path, within):
    node = node_factory("--virtual-gpus", "1x1GiB")
    script = tmp_path / "midst.py"
    script.write_text(MIDST)
    saved = tmp_path / "saved.pt"
    good = {"weight": torch.ones(1, 2), "bias": torch.zeros(1)}
    torch.save(good, saved)
    proc = node.launch(str(script), str(saved), within, log_name="midst.log")
    job = node.job_of(proc.pid)
    node.wait_for(lambda: node.job(job)["step"] > 2, 60, "training")
    with contextlib.suppress(Exception):    # (the job may end before it answers)
        node.call("suspend", job=job)
        if within == "resume":
            node.call("resume", job=job)
    assert proc.wait(60) == 130
    said = (tmp_path / "midst.log").read_text()
    assert "Traceback" not in said and "Ctrl-C handling is not run" in said, said
    mine = torch.load(saved)
    assert all(torch.equal(mine[k], good[k]) for k in good), mine


ASYNC = """import asyncio, signal
print("python's handler:", signal.getsignal(signal.SIGINT) is signal.default_int_handler, flush=True)
async def main():
    try:
        print("ready", flush=True)
        await asyncio.sleep(600)
    except asyncio.CancelledError:      # asyncio's Ctrl-C cancels the main task: it may end cleanly
        return "stopped cleanly"
print(asyncio.run(main()), flush=True)
"""


def test_a_script_under_gmux_launch_has_pythons_ctrl_c_handling_and_asyncios(node_factory, tmp_path):
    """gmux-launch's own SIGINT handler stayed in place while the script ran, so asyncio.run, which installs its
    handler only over python's, left Ctrl-C to raise KeyboardInterrupt through the loop: an asyncio script could
    not end cleanly on Ctrl-C. gmux's handler is now there only while gmuxd holds the job."""
    node = node_factory("--virtual-gpus", "1x1GiB")
    (tmp_path / "aio.py").write_text(ASYNC)
    proc = node.launch(str(tmp_path / "aio.py"), log_name="aio.log")
    log = tmp_path / "aio.log"
    node.wait_for(lambda: "ready" in log.read_text(), 60, lambda: "the script's loop: " + log.read_text())
    os.kill(proc.pid, signal.SIGINT)
    assert proc.wait(60) == 0, log.read_text()
    said = log.read_text()
    assert "python's handler: True" in said and "stopped cleanly" in said and "Traceback" not in said, said


def test_logs_says_what_a_reply_left_out(node_factory, tmp_path):
    """A log past 512 KiB was shown from its last 512 KiB without a word: what was left out is said on stderr
    (stdout stays the log's), with the file that has all of it; --json carries the same."""
    node = node_factory("--virtual-gpus", "1x1GiB")
    script = tmp_path / "chatty.py"
    script.write_text("for i in range(20000):\n    print(f'line {i:06d} ' + 'x' * 60)\n")   # 1.4 MB
    job = json.loads(gmux(node.rt, "--json", "submit", "--", "python", str(script)).stdout)["job"]
    node.wait_for(lambda: node.job(job)["state"] == "exited", 60, "printed")
    path = os.path.join(node.rt, "logs", f"{job}.log")
    size = os.path.getsize(path)
    out = gmux(node.rt, "logs", job)
    assert out.returncode == 0 and out.stdout.endswith("line 019999 " + "x" * 60 + "\n")
    assert out.stdout.startswith("line ") and len(out.stdout) > (512 << 10) - 73   # from a line's start: it began mid-line
    assert "line 000000" not in out.stdout and "left out" not in out.stdout
    assert f"only the last 512 KiB of {job}'s log are shown" in out.stderr and f"All of it: {path}" in out.stderr
    shown = json.loads(gmux(node.rt, "--json", "logs", job).stdout)
    assert shown["left_out"] == size - len(shown["text"].encode()) and shown["log"] == path
    assert "left out" in gmux(node.rt, "logs", job, "--tail", "100000").stderr   # more lines than a reply holds
    assert "left out" in gmux(node.rt, "logs", job, "--raw").stderr
    assert gmux(node.rt, "logs", job, "--tail", "5").stderr == ""                  # all it asked for
    # A log whose bytes are not text, shorter than a reply: as text it is longer (each byte a U+FFFD, 3 bytes), and
    # the command said that what came before had been left out where it could not read the file. gmuxd counts it.
    (tmp_path / "binary.py").write_text("import sys\nsys.stdout.buffer.write(b'\\xff' * 300_000)\n")
    job = json.loads(gmux(node.rt, "--json", "submit", "--", "python", str(tmp_path / "binary.py")).stdout)["job"]
    node.wait_for(lambda: node.job(job)["state"] == "exited", 60, "written")
    shown = gmux(node.rt, "--json", "logs", job)
    assert json.loads(shown.stdout)["left_out"] == 0 and "left out" not in shown.stderr, shown


def test_logs_of_a_name_whose_runs_have_ended_are_its_newest_runs(node_factory, tmp_path):
    """`gmux logs NAME` said "no job" once the run of that name had ended (an outside review): a name names live
    jobs only, since it comes back with each run, but its logs are wanted most once it has ended. Acting on an
    ended run still takes its id."""
    node = node_factory("--virtual-gpus", "1x1GiB")
    (tmp_path / "say.py").write_text("import sys\nprint('run', sys.argv[1])\n")
    for run in ("1", "2"):
        job = json.loads(gmux(node.rt, "--json", "submit", "--name", "hello", "--", "python",
                              str(tmp_path / "say.py"), run).stdout)["job"]
        node.wait_for(lambda: node.job(job)["state"] == "exited", 60, "said")
    out = gmux(node.rt, "logs", "hello")
    assert out.returncode == 0 and out.stdout == "run 2\n", out
    launched = node.launch(str(tmp_path / "say.py"), "3", opts=["--name", "hello"], log_name="launched.log")
    assert launched.wait(60) == 0           # (newer, but gmux-launch's output went to its terminal: no log)
    node.wait_for(lambda: all(j["state"] == "exited" for j in node.ps()["jobs"] if j.get("name") == "hello"), 30,
                  "the launched run ended")
    out = gmux(node.rt, "logs", "hello")
    assert out.returncode == 0 and out.stdout == "run 2\n", out
    out = gmux(node.rt, "kill", "hello")
    # (ended: said so, as of an id, not "no job 'hello'")
    assert out.returncode == 1 and "named 'hello' has ended (exited: finished)" in out.stderr, out


BAD_IDS = [["suspend", "nosuch"], ["resume", "nosuch"], ["kill", "nosuch"], ["migrate", "nosuch", "--gpu", "1"],
           ["logs", "nosuch"], ["kill", ""], ["logs", "\x1b[31mRED"]]


def test_every_error_under_json_is_json(node_factory, tmp_path):
    """`gmux --json kill nosuch` printed its error as text; each error under --json is one JSON object on stdout
    (status 1; 2 for a command line argparse refuses), whether --json comes before the command or after."""
    node = node_factory("--virtual-gpus", "2x1GiB")
    for args in BAD_IDS:
        for out in (gmux(node.rt, "--json", *args), gmux(node.rt, *args, "--json")):
            said = json.loads(out.stdout)
            assert out.returncode == 1 and said["status"] == 1 and args[0] in said["error"], (args, out)
            assert out.stderr == "" and "\x1b" not in out.stdout, (args, out)
    for args, usage in ((["logs", "j1", "--tail", "x"], "gmux logs"), (["logs", "j1", "-f"], "gmux logs"),
                        (["logs", "j1", "--raw"], "gmux logs"), (["bogus"], "gmux [-h]"),
                        (["ps", "--limit", "0"], "gmux ps")):
        out = gmux(node.rt, "--json", *args)
        said = json.loads(out.stdout)
        assert out.returncode == 2 and said["status"] == 2 and said["usage"].startswith(f"usage: {usage}"), out
    out = gmux(str(tmp_path / "nowhere"), "--json", "ps")
    assert out.returncode == 1 and "gmuxd is not running" in json.loads(out.stdout)["error"]


def test_a_commands_bad_options_get_its_own_usage(node_factory):
    """`gmux logs JOB -f` showed the usage of gmux itself (its commands, not the options of logs)."""
    node = node_factory("--virtual-gpus", "1x1GiB")
    for args, needle in ((["logs", "j1", "-f"], "unrecognized arguments: -f"),
                         (["logs", "-f"], "required: job"),
                         (["ps", "--tail", "3"], "unrecognized arguments: --tail 3")):
        out = gmux(node.rt, *args)
        command = args[0]
        assert out.returncode == 2 and out.stderr.startswith(f"usage: gmux {command} "), (args, out.stderr)
        assert f"gmux {command}: error: " in out.stderr and needle in out.stderr, (args, out.stderr)
    assert gmux(node.rt, "-x", "ps").stderr.startswith("usage: gmux [-h]")    # gmux's own option: its usage


def test_errors_speak_the_users_words(node_factory, tmp_path):
    """Numbers past the wire's bounds were refused naming its fields (submit.gpus, kill.job), and a submitted
    gang that does not fit by the id gmuxd would have given it (gangj1, shown nowhere)."""
    node = node_factory("--virtual-gpus", "2x1GiB")
    script = tmp_path / "x.py"
    script.write_text("pass\n")
    for args, said in ((["submit", "--gpus", "99", "--", "python", str(script)],
                        "gmux: submit: --gpus 99: this machine has 2 GPUs (0, 1)\n"),
                       (["submit", "--ranks", "99", "--", "python", str(script)],
                        "gmux: submit: --ranks 99: this machine has 2 GPUs (0, 1), and each rank needs one of its "
                        "own\n"),
                       (["submit", "--gpu", "9999", "--", "python", str(script)],
                        "gmux: submit: --gpu 9999: this machine has 2 GPUs (0, 1)\n"),
                       (["migrate", "j1", "--gpu", "9999"],
                        "gmux: migrate: --gpu 9999: this machine has 2 GPUs (0, 1)\n"),
                       (["submit", "--ranks", "3", "--", "python", str(script)],
                        "gmux: submit: --ranks 3: this machine has 2 GPUs that can hold a rank, and each rank needs "
                        "a GPU of its own\n"),
                       (["kill", ""], "gmux: kill: JOB: '' is not a valid name"),
                       (["ps", "--limit", "99999999999999999999"], "gmux: ps: --limit: 99999999999999999999 is "
                                                                   "outside")):
        out = gmux(node.rt, *args)
        assert out.returncode == 1 and out.stderr.startswith(said), (args, out.stderr)
    assert [j["id"] for j in node.ps()["jobs"]] == []


def test_a_waiting_job_says_what_it_waits_for(node_factory, tmp_path):
    """A job admitted to a GPU and waiting there for its first turn showed an empty WHAT HAPPENED."""
    node = node_factory("--virtual-gpus", "1x1GiB", "--quantum", "600")
    first = json.loads(gmux(node.rt, "--json", "submit", "--mem", "700MiB", "--", PY, TRAIN,
                            str(tmp_path / "a.json"), "1000000", "--sleep", "0.01").stdout)["job"]
    node.wait_for(lambda: node.job(first)["state"] == "running", 60, "the first job running")
    second = json.loads(gmux(node.rt, "--json", "submit", "--mem", "700MiB", "--", PY, TRAIN,
                             str(tmp_path / "b.json"), "10").stdout)["job"]
    said = f"waiting for memory on GPU 0: it needs 700.0MiB; {first} runs there, holding 700.0MiB of 1.0GiB"
    # gmuxd says it, so `gmux ps --json` carries it too (the table alone worked it out)
    node.wait_for(lambda: (node.job(second)["state"], node.job(second)["detail"]) == ("waiting", said), 60,
                  lambda: node.job(second))
    listed = json.loads(gmux(node.rt, "--json", "ps").stdout)["jobs"]
    assert [j["detail"] for j in listed if j["id"] == second] == [said], listed
    table = gmux(node.rt, "ps").stdout
    assert said in _column(table, second), table


def test_what_a_waiting_job_waits_for():
    from gmux.node.waiting import waiting_detail
    job = {"id": "j2", "working_set": 300 << 20}
    gpu = {"index": 1, "resident": ["j1", "j2"], "resident_mem": 700 << 20, "mem_total": 1 << 30}
    assert waiting_detail(job, None) == "waiting for a GPU"
    assert waiting_detail(job, {**gpu, "resident": ["j2"]}) == "waiting for its first turn on GPU 1"
    assert waiting_detail(job, gpu) == "waiting for its turn on GPU 1: j1 runs there"
    assert waiting_detail(job, {**gpu, "resident": ["j1", "j3"], "resident_mem": 800 << 20}) == \
        "waiting for memory on GPU 1: it needs 300.0MiB; j1, j3 run there, holding 800.0MiB of 1.0GiB"
    assert waiting_detail({**job, "working_set": None}, gpu) == \
        "waiting for GPU 1 to itself (its size is not known: no --mem): j1 runs there"


def _column(table: str, job: str, column: int = -2) -> str:
    """A column of `job`'s row in a rich table (the last, WHAT HAPPENED; 2: NAME), its wrapped lines joined."""
    lines = table.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"│ {job} "))
    cells = [lines[start].split("│")[column].strip()]
    for line in lines[start + 1:]:
        if not line.startswith("│  "):
            break
        cells.append(line.split("│")[column].strip())
    return " ".join(c for c in cells if c)


@pytest.mark.parametrize("name, needle", [
    ("ј45", "looks like a job id (gmux names jobs j1, j2, ...): it is written with 'ј' (U+0458 CYRILLIC SMALL "
            "LETTER JE)"),
    ("Ｊ99", "looks like a job id (gmux names jobs j1, j2, ...): it is written with 'Ｊ' (U+FF2A FULLWIDTH"),
    ("j45", "looks like a job id"),
    ("ﬁne", "reads as 'fine' (written with 'ﬁ' (U+FB01 LATIN SMALL LIGATURE FI))"),
    ("rеsnet", "mixes Latin and Cyrillic letters"),
])
def test_lookalike_job_names_are_refused_naming_the_problem(tmp_path, name, needle):
    """A name in lookalike characters was taken, then read in gmux ps as another job's id (Cyrillic 'ј45')."""
    for command in (["gmux.cli.gmux", "--runtime-dir", str(tmp_path), "submit"], ["gmux.cli.launch"]):
        out = subprocess.run([PY, "-m", *command, "--name", name, "--", "python", "x.py"], env=env(), cwd=ROOT,
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 2 and f"argument --name: {name!r} {needle}" in out.stderr, out.stderr


def test_names_in_one_script_are_taken():
    from gmux.cli.argtypes import job_name
    for name in ("resnet-50", "b12", "训练", "обучение", "ab.v2", "J-7"):
        assert job_name(name) == name


def test_a_file_as_runtime_dir_is_named_a_file(tmp_path):
    """`gmux --runtime-dir FILE` said no gmuxd was running there, as if one could."""
    (tmp_path / "afile").write_text("")
    for rt in (str(tmp_path / "afile"), str(tmp_path / "afile" / "sub")):
        said = f"{tmp_path / 'afile'} is a file, not a directory"
        out = gmux(rt, "ps")
        assert out.returncode == 2 and said in out.stderr and "not running" not in out.stderr, out.stderr
        out = subprocess.run([PY, "-m", "gmux.cli.gmux", "ps"], env={**env(), "GMUX_RUNTIME_DIR": rt}, cwd=ROOT,
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 2 and said in out.stderr, out.stderr
        out = subprocess.run([PY, "-m", "gmux.cli.launch", "--runtime-dir", rt, "--", "python", "x.py"], env=env(),
                             cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert out.returncode == 2 and said in out.stderr, out.stderr
        from gmux.wire.daemon_client import Client, GmuxError
        with pytest.raises(GmuxError, match="is a file, not a directory"):
            Client(rt)
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    for rt, what in (("/dev/null", "a device or a socket"), (str(tmp_path / "dangling"), "a link to nothing")):
        out = gmux(rt, "ps")        # (it said "/dev/null is not a directory, not a directory")
        assert out.returncode == 2 and f"{rt} is {what}, not a directory (" in out.stderr, out.stderr


def test_an_unnamed_gang_is_named_after_its_first_rank_and_takes_no_id(node_factory, tmp_path):
    """An unnamed gang took a job id of its own (gangj1: its ranks j2, j3, and no j1 ever listed)."""
    node = node_factory("--virtual-gpus", "2x1GiB")
    script = tmp_path / "sleeps.py"
    script.write_text("import time\ntime.sleep(600)\n")
    sub = json.loads(gmux(node.rt, "--json", "submit", "--ranks", "2", "--no-hook", "--", "python", str(script)).stdout)
    assert (sub["gang"], sub["jobs"]) == ("gang-j1", ["j1", "j2"]), sub
    node.wait_for(lambda: all(node.job(j)["state"] == "running" for j in sub["jobs"]), 60, lambda: node.ps()["jobs"])
    table = gmux(node.rt, "ps").stdout
    assert [_column(table, j, 2) for j in sub["jobs"]] == ["gang-j1-0 (gang gang-j1 0/2)",
                                                          "gang-j1-1 (gang gang-j1 1/2)"], table
    killed = json.loads(gmux(node.rt, "--json", "kill", "gang-j1").stdout)     # by its name: every rank
    assert killed["jobs"] == ["j1", "j2"], killed
    (tmp_path / "x.py").write_text("pass\n")
    after = json.loads(gmux(node.rt, "--json", "submit", "--", "python", str(tmp_path / "x.py")).stdout)
    assert after["job"] == "j3", after


def test_an_unnamed_gang_takes_no_name_a_live_job_has(node_factory, tmp_path):
    """A job named gang-j2 (itself j1), then an unnamed gang whose first rank is j2: the gang was named gang-j2
    too, and `gmux suspend gang-j2` said "3 live jobs are named 'gang-j2'", acting on neither."""
    node = node_factory("--virtual-gpus", "2x1GiB")
    script = tmp_path / "sleeps.py"
    script.write_text("import time\ntime.sleep(600)\n")
    alone = json.loads(gmux(node.rt, "--json", "submit", "--name", "gang-j2", "--no-hook", "--", "python",
                            str(script)).stdout)
    sub = json.loads(gmux(node.rt, "--json", "submit", "--ranks", "2", "--no-hook", "--", "python", str(script)).stdout)
    assert (alone["job"], sub["gang"], sub["jobs"]) == ("j1", "gang-j2.2", ["j2", "j3"]), (alone, sub)
    assert json.loads(gmux(node.rt, "--json", "kill", "gang-j2").stdout)["jobs"] == ["j1"]
    assert json.loads(gmux(node.rt, "--json", "kill", "gang-j2.2").stdout)["jobs"] == ["j2", "j3"]


def test_a_name_a_live_job_or_gang_has_is_refused_to_a_gang_or_a_job(node_factory, tmp_path):
    """A gang submitted with --name g beside a job named g (or g-1, its rank 1's name), or a job named after a
    live gang: each was taken, and the name then picked out neither (`gmux suspend g`: "3 live jobs are named")."""
    node = node_factory("--virtual-gpus", "2x1GiB")
    script = tmp_path / "sleeps.py"
    script.write_text("import time\ntime.sleep(600)\n")
    submit = lambda *args: gmux(node.rt, "--json", "submit", *args, "--no-hook", "--", "python", str(script))
    assert submit("--name", "g").returncode == 0 and submit("--name", "h-1").returncode == 0
    assert submit("--ranks", "2", "--name", "k").returncode == 0
    for args, said in ((("--ranks", "2", "--name", "g"), "your job j1 named 'g' has not ended"),
                       (("--ranks", "2", "--name", "h"), "your job j2 named 'h-1' has not ended"),
                       (("--name", "k"), "your gang 'k' has not ended (its rank 0 is j3,")):
        out = submit(*args)
        assert out.returncode == 1 and said in out.stdout and "choose another --name" in out.stdout, (args, out)
    assert [j["id"] for j in node.ps()["jobs"]] == ["j1", "j2", "j3", "j4"]
    assert json.loads(gmux(node.rt, "--json", "kill", "k").stdout)["jobs"] == ["j3", "j4"]
    assert submit("--name", "k").returncode == 0        # (its gang has ended: the name is free again)


@pytest.mark.parametrize("fields, needle", [
    ({"type": "submit", "argv": ["python", "x.py"], "cwd": "/", "name": "ј45"}, "submit.name: 'ј45' looks like a job"),
    ({"type": "submit", "argv": ["python", "x.py"], "cwd": "/", "name": "J7"}, "submit.name: 'J7' looks like a job"),
    ({"type": "register", "argv": ["python", "x.py"], "name": "Ｊ99"}, "register: name: 'Ｊ99' looks like"),
    ({"type": "register", "argv": ["python", "x.py"], "name": "ﬁne"}, "register: name: 'ﬁne' reads as 'fine'"),
    # (taken, `gmux kill -foo` said "the following arguments are required: job": only `gmux kill -- -foo` named it)
    ({"type": "submit", "argv": ["python", "x.py"], "cwd": "/", "name": "-foo"}, "submit.name: '-foo' starts with "
                                                                                 "'-', which reads as an option"),
    ({"type": "register", "argv": ["python", "x.py"], "gang": {"id": "-g", "rank": 0, "size": 2}},
     "register: gang: id: '-g' starts with '-'"),
    ({"type": "register", "argv": ["python", "x.py"], "gang": {"id": "rеsnet", "rank": 0, "size": 2}},
     "register: gang: id: 'rеsnet' mixes Latin and Cyrillic letters"),
    # (and a command gmuxd could not start: an internal error, from the spawn)
    ({"type": "submit", "argv": ["python", "-c", "x"], "cwd": "/"}, "submit: a job runs a script or a module (-m), "
                                                                     "not python -c"),
    ({"type": "submit", "argv": ["python", "-W"], "cwd": "/"}, "submit: python -W needs a value"),
    ({"type": "submit", "argv": ["python", "x.py"], "cwd": "relative/dir"},
     "submit: the working directory 'relative/dir' is not an absolute path"),
    ({"type": "submit", "argv": ["python", "x.py"], "cwd": "/no/such/dir"},
     "submit: cannot run the job in '/no/such/dir': No such file or directory"),
])
def test_gmuxd_refuses_lookalike_names_from_any_client(daemon, fields, needle):
    """Only the CLI refused them: a client writing its own frames (ZeroMQ and msgpack) had gmuxd take them."""
    fields = {**fields, **({"admin": daemon.admin} if fields["type"] == "submit" else {"pid": daemon.stand_in_pid})}
    frame = msgpack.packb({"v": protocol.VERSION, "id": 5, **fields})   # (as sent: no validation on this side)
    daemon.sent.clear()
    daemon.server.receive(b"c", [frame])
    replies = [m for _, m in daemon.sent if m["type"] == "reply"]
    assert [r["ok"] for r in replies] == [False] and needle in replies[0]["error"], replies
    assert daemon.jobs == {}


def test_gmux_launch_refuses_a_lookalike_gang_name(tmp_path):
    out = subprocess.run([PY, "-m", "gmux.cli.launch", "--runtime-dir", str(tmp_path), "--gang", "ј45", "--rank", "0",
                          "--world", "2", "--", "python", "x.py"], env=env(), cwd=ROOT, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 2 and "argument --gang: 'ј45' looks like a job id" in out.stderr, out.stderr


def test_gmux_launch_names_its_own_option_for_a_value_the_wire_refuses(node_factory, tmp_path):
    """gmux-launch --gpus 65 said "register.gpus: 65 is outside [1, 64]", a field of the wire the user never typed."""
    node = node_factory("--virtual-gpus", "1x1GiB")
    script = tmp_path / "x.py"
    script.write_text("pass\n")
    for args, said in ((["--gpus", "65"], "gmux-launch: --gpus: 65 is outside [1, 64]\n"),
                       (["--gpu", "70000"], "gmux-launch: --gpu: 70000 is outside [0, 4096]\n")):
        out = subprocess.run([PY, "-m", "gmux.cli.launch", "--runtime-dir", node.rt, *args, "--", "python",
                              str(script)], env=env(), cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert out.returncode == 2 and out.stderr == said, (args, out.stderr)
    assert node.ps()["jobs"] == []


def test_cluster_commands_errors_under_json_are_json_and_bad_options_get_the_commands_usage(tmp_path):
    """`gmux ps --cluster ADDR --json` said its errors as text, and a command's unknown option showed gmux's usage."""
    cluster = ["--cluster", "tcp://127.0.0.1:1", "--keys", str(tmp_path / "nokeys")]
    for args, status, needle in ((["ps", *cluster], 1, "no key file"),
                                 (["kill", *cluster, "c1"], 1, "no key file"),
                                 (["keys", "--dir", str(tmp_path)], 2, "say which pairs to create"),
                                 (["ps", *cluster, "--tail", "3"], 2, "unrecognized arguments: --tail 3"),
                                 (["kill", *cluster], 2, "required: job")):
        for out in (gmux(str(tmp_path), "--json", *args), gmux(str(tmp_path), *args, "--json")):
            said = json.loads(out.stdout)
            assert out.returncode == status == said["status"] and needle in said["error"] and out.stderr == "", out
            assert status == 1 or said["usage"].startswith(f"usage: gmux {args[0]} "), said
        out = gmux(str(tmp_path), *args)
        assert out.returncode == status and needle in out.stderr and out.stdout == "", out
        assert status == 1 or out.stderr.startswith(f"usage: gmux {args[0]} "), out.stderr


def test_a_command_line_missing_its_point_is_a_usage_error(tmp_path):
    """`gmux keys` with no pair to make and `gmux submit` with no command exited 1, as a failure does, where every
    other slip on a gmux command line is argparse's status 2 with the command's usage."""
    cluster = ["--cluster", "tcp://127.0.0.1:1", "--keys", str(tmp_path / "nokeys")]
    keydir = ["--dir", str(tmp_path / "k")]
    no_command = "give the command after --, e.g. gmux submit"
    for args, needle in ((["keys", *keydir], "say which pairs to create: --scheduler, --daemon NAME, --client NAME"),
                         (["keys", *keydir, "--client", "a", "--scheduler", "--client", "a"], "--client a given twice"),
                         (["keys", *keydir, "--daemon", "a/b"], "argument --daemon: key name 'a/b'"),
                         (["keys", "--dir", "", "--scheduler"], "argument --dir: an empty path"),
                         (["ps", "--cluster", "tcp://127.0.0.1:1", "--keys", ""], "argument --keys: an empty path"),
                         (["submit", *cluster], f"{no_command} --cluster ADDR -- python train.py"),
                         (["submit", *cluster, "--name", "x", "--"], f"{no_command} --cluster ADDR -- python"),
                         (["submit"], f"{no_command} -- python train.py"),
                         (["submit", "--name", "x", "--"], f"{no_command} -- python train.py")):
        out = gmux(str(tmp_path), *args)
        assert out.returncode == 2 and out.stderr.startswith(f"usage: gmux {args[0]} "), (args, out)
        assert f"gmux {args[0]}: error: {needle}" in out.stderr, (args, out.stderr)
        out = gmux(str(tmp_path), "--json", *args)
        said = json.loads(out.stdout)
        assert out.returncode == 2 == said["status"] and needle in said["error"], (args, out)
    assert not (tmp_path / "k").exists()      # (refused before any key was made)


def test_a_submitted_job_suspended_before_its_process_registers_is_held_and_resumes(node_factory, tmp_path):
    """`gmux suspend` straight after `gmux submit`, while the job's process still imported torch: gmuxd failed
    with an internal error (KeyError: the job had a GPU but no place in its slicer yet), and the job was held all
    the same. It is held now, and said so: it starts no step until resumed, then trains to its end."""
    node = node_factory("--virtual-gpus", "1x1GiB")
    out = tmp_path / "a.json"
    job = json.loads(gmux(node.rt, "--json", "submit", "--", "python", TRAIN, str(out), "30").stdout)["job"]
    said = gmux(node.rt, "--json", "suspend", job)
    assert said.returncode == 0 and "internal error" not in said.stderr, said.stderr
    assert json.loads(said.stdout)["state"] == "held"
    # (its import of torch: until its process registers, gmuxd says it is "starting"; a job not held would
    # start its 30 steps straight after, done in well under a second)
    node.wait_for(lambda: node.job(job)["detail"] != "starting", 60,
                  lambda: f"its process registered: {node.job(job)}")
    time.sleep(2.0)
    assert node.job(job)["step"] == 0 and node.job(job)["state"] == "held", node.job(job)
    assert node.call("ping")["internal_errors"] == 0
    assert gmux(node.rt, "resume", job).returncode == 0
    node.wait_for(lambda: node.job(job)["state"] == "exited", 120, "trained")
    assert json.loads(out.read_text())["steps"] == 30


def test_a_request_too_large_or_unreadable_is_refused_at_once(node_factory, tmp_path):
    """A submit over the 1 MiB limit of a message (each argument under its own limit, all of them over): gmuxd
    refused it unread, with no id to answer to, the CLI waited out its 60 s and then said gmuxd "may have
    started the job all the same". Now the CLI says so before it sends; and a refusal of any message gmuxd could
    not read answers the request that waits (a client speaking another table, here)."""
    from gmux.wire.daemon_client import Client, GmuxError
    node = node_factory("--virtual-gpus", "1x1GiB")
    t0 = time.monotonic()
    said = gmux(node.rt, "submit", "--", "python", TRAIN, *["x" * 4000] * 300)
    assert said.returncode != 0 and "over the 1,048,576-byte limit of one message" in said.stderr, said.stderr
    assert "may have started" not in said.stderr and not node.ps()["jobs"]
    client = Client(node.rt)
    client.requests.table = protocol.CLUSTER_MESSAGES
    try:
        with pytest.raises(GmuxError, match="node_report"):
            client.requests.call("node_report", 60.0, name="m1", gpus=[], transfer="tcp://127.0.0.1:1", jobs=[])
    finally:
        client.close()
    assert time.monotonic() - t0 < 50       # (either alone waited 60 s before)


def test_ctrl_c_to_a_moved_jobs_new_process_before_it_registers_says_where_its_state_is(node_factory, tmp_path):
    """A move's new process (or a job gmuxd started) interrupted before it registered said "nothing ran" and
    wrote no exit record, and the job was recorded lost; its state is in the checkpoint it was to restore."""
    node = node_factory("--virtual-gpus", "1x1GiB")
    node.kill_daemon()          # (the new process waits for a gmuxd to take it up)
    kept, script = tmp_path / "j9.ckpt", tmp_path / "never.py"
    script.write_text("raise SystemExit('it ran')\n")
    kept.write_bytes(b"")     # (one not there ends the launch at once)
    proc = subprocess.Popen([PY, "-m", "gmux.cli.launch", "--runtime-dir", node.rt, "--job", "j9", "--restore",
                             str(kept), "--", "python", str(script)],
                            env={**env(), "GMUX_JOB_TOKEN": "t" * 32}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True)
    time.sleep(3.0)
    proc.send_signal(signal.SIGINT)
    out = proc.communicate(timeout=30)[0].decode()
    assert proc.returncode == 130, out
    assert out.splitlines()[-1] == f"gmux-launch: job j9 interrupted before it registered: it ends (its state is kept in {kept})"
    record = json.loads(open(RuntimeDir(node.rt).exit_file("j9")).read())
    assert record["status"] == 130 and record["reason"] == f"interrupted (SIGINT) before it registered; its state " \
        f"is kept in {kept}", record


def test_a_gangs_suspend_answered_by_its_deadline_names_every_rank(node_factory, tmp_path):
    """`gmux suspend g` of a gang whose ranks reach no boundary by their deadline (stopped, SIGSTOP, instead)
    answered "j1: GPU 0: j1 did not reach a boundary ...": every rank was held and stopped, but the answer (and its
    --json, without "jobs") named rank 0 alone, where a suspend taken at a boundary names them all. It said they
    were "continued (SIGCONT) at each of [their] turns": held, they stay stopped until `gmux resume`; which said
    the gang "runs in its turn on GPU 0", its rank 0's GPU alone."""
    node = node_factory("--virtual-gpus", "2x1GiB")
    script = tmp_path / "sleeps.py"
    script.write_text("import time\ntime.sleep(600)\n")
    sub = json.loads(gmux(node.rt, "--json", "submit", "--ranks", "2", "--name", "g", "--", "python",
                          str(script)).stdout)
    node.wait_for(lambda: all(node.job(j)["state"] == "running" for j in sub["jobs"]), 60, lambda: node.ps()["jobs"])
    out = gmux(node.rt, "--json", "suspend", "g")
    said = json.loads(out.stdout)
    assert out.returncode == 0 and said["kind"] == "stop" and said["jobs"] == ["j1", "j2"], said
    # (held, a rank gets no turns until resumed: it was said to be "continued (SIGCONT) at each of its turns")
    assert "stopped (SIGSTOP) while held, until `gmux resume`" in said["detail"], said
    node.wait_for(lambda: all(node.job(j)["held"] for j in sub["jobs"]), 30, lambda: node.ps()["jobs"])
    time.sleep(2)
    for j in sub["jobs"]:
        with open(f"/proc/{node.job(j)['pid']}/stat") as f:
            assert f.read().rsplit(")", 1)[1].split()[0] == "T"
    out = gmux(node.rt, "resume", "g")     # (its ranks on GPUs 0 and 1: it said "runs in its turn on GPU 0")
    assert out.stdout == "j1, j2: runnable: runs in its turn on GPUs 0, 1\n", out
    out = gmux(node.rt, "suspend", "g")
    assert out.returncode == 0 and out.stdout.startswith("j1, j2: "), out


def test_a_job_waiting_behind_one_without_a_boundary_says_so(node_factory, tmp_path):
    """A 2-GPU job waiting behind a script that never reaches a boundary (its start, a resume, never acknowledged)
    said, for as long as it waited, "GPU 0 holds j1, which cannot move (busy with a resume)", as if that were a
    moment's work: it says that j1 has reached no boundary yet."""
    node = node_factory("--virtual-gpus", "2x1GiB")
    script = tmp_path / "sleeps.py"
    script.write_text("import time\ntime.sleep(600)\n")
    first = json.loads(gmux(node.rt, "--json", "submit", "--", "python", str(script)).stdout)["job"]
    node.wait_for(lambda: node.job(first)["state"] == "running", 60, lambda: node.ps()["jobs"])
    wide = json.loads(gmux(node.rt, "--json", "submit", "--gpus", "2", "--", "python", str(script)).stdout)["job"]
    node.wait_for(lambda: "which cannot move (" in node.job(wide)["detail"], 60, lambda: node.job(wide))
    detail = node.job(wide)["detail"]
    assert f"holds {first}, which cannot move (it has reached no boundary yet" in detail, detail
    assert "busy with" not in detail, detail


def test_a_job_on_gpus_of_its_own_without_a_boundary_is_not_said_to_be_stopped(node_factory, tmp_path):
    """A --gpus 2 job (and a gang's ranks) that reaches no boundary showed "no boundary yet: computes in its turns,
    stopped (SIGSTOP) between them": such a job is never stopped for others (its GPUs are its own), and was not."""
    node = node_factory("--virtual-gpus", "2x1GiB")
    script = tmp_path / "sleeps.py"
    script.write_text("import time\ntime.sleep(600)\n")
    for opts in (["--gpus", "2"], ["--ranks", "2"]):
        sub = json.loads(gmux(node.rt, "--json", "submit", *opts, "--", "python", str(script)).stdout)
        jobs = sub.get("jobs") or [sub["job"]]
        node.wait_for(lambda: all("no boundary yet" in node.job(j)["detail"] for j in jobs), 60,
                      lambda: node.ps()["jobs"])
        for j in jobs:
            detail = node.job(j)["detail"]
            assert "SIGSTOP" not in detail and "never stopped (its GPUs are its own)" in detail, detail
            with open(f"/proc/{node.job(j)['pid']}/stat") as f:
                assert f.read().rsplit(")", 1)[1].split()[0] != "T"
        assert json.loads(gmux(node.rt, "--json", "kill", jobs[0]).stdout)["jobs" if len(jobs) > 1 else "job"]


def test_a_job_alone_without_a_boundary_is_not_said_to_be_stopped_between_turns(node_factory, tmp_path):
    """A job alone on its GPU that reaches no boundary showed "computes in its turns, stopped (SIGSTOP) between
    them": alone it has no turns, and it was never stopped. A second job on that GPU makes turns of it again."""
    node = node_factory("--virtual-gpus", "1x1GiB")
    script = tmp_path / "sleeps.py"
    script.write_text("import time\ntime.sleep(600)\n")
    submit = lambda: json.loads(gmux(node.rt, "--json", "submit", "--no-hook", "--", "python", str(script)).stdout)
    job = submit()["job"]
    node.wait_for(lambda: "no boundary yet" in node.job(job)["detail"], 60, lambda: node.ps()["jobs"])
    detail = node.job(job)["detail"]
    assert detail.startswith("no boundary yet: computes on alone") and "once another job shares GPU 0" in detail, \
        detail
    with open(f"/proc/{node.job(job)['pid']}/stat") as f:
        assert f.read().rsplit(")", 1)[1].split()[0] != "T"
    other = submit()["job"]
    node.wait_for(lambda: "computes on alone" not in node.job(job)["detail"], 60, lambda: node.ps()["jobs"])
    for j in (job, other):
        gmux(node.rt, "kill", j)


def test_a_second_suspend_sent_while_the_first_waits_says_no_more_wait_than_its_own(node_factory, tmp_path):
    """Two `gmux suspend J` a moment apart, the job's mini-batch long: the second answered "suspended j1 in 2547.5
    ms (2823.7 ms of it waiting for the mini-batch to end)", a part longer than the whole (the job's wait counts
    from the first command's sending)."""
    node = node_factory("--virtual-gpus", "1x1GiB")
    script = tmp_path / "slow.py"
    script.write_text("import time, torch\n"
                      "m = torch.nn.Linear(2, 1)\n"
                      "opt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
                      "while True:\n"
                      "    m(torch.ones(1, 2)).sum().backward()\n"
                      "    opt.step()\n"
                      "    opt.zero_grad()\n"
                      "    time.sleep(4)\n")
    job = json.loads(gmux(node.rt, "--json", "submit", "--", "python", str(script)).stdout)["job"]
    node.wait_for(lambda: node.job(job)["step"] >= 2, 60, lambda: node.job(job))
    step = node.job(job)["step"]
    node.wait_for(lambda: node.job(job)["step"] > step, 60, lambda: node.job(job))    # (a mini-batch just began)
    cmd = [PY, "-m", "gmux.cli.gmux", "--runtime-dir", node.rt, "suspend", job]
    first = subprocess.Popen(cmd, env=env(), cwd=ROOT, stdout=subprocess.PIPE, text=True)
    time.sleep(0.5)
    second = subprocess.Popen(cmd, env=env(), cwd=ROOT, stdout=subprocess.PIPE, text=True)
    for proc in (first, second):
        out = proc.communicate(timeout=60)[0]
        m = re.fullmatch(rf"suspended {job} in ([\d.]+) ms \(([\d.]+) ms of it waiting for the mini-batch to end\)\n",
                         out)
        assert proc.returncode == 0 and m and float(m[2]) <= float(m[1]), out


def test_logs_of_an_ended_gmux_launch_job_by_its_name_says_where_its_output_went(node_factory, tmp_path):
    """`gmux logs NAME` of a gmux-launch job said where its output goes while it ran, and "no job 'NAME'" once it
    had ended (by its id it still said where)."""
    node = node_factory("--virtual-gpus", "1x1GiB")
    script = tmp_path / "sleeps.py"
    script.write_text("import time\ntime.sleep(600)\n")
    proc = node.launch(str(script), opts=["--name", "launched"])
    job = node.job_of(proc.pid)
    assert gmux(node.rt, "kill", "launched").returncode == 0
    node.wait_for(lambda: node.job(job)["state"] == "killed", 30, lambda: node.job(job))
    for key in ("launched", job):
        out = gmux(node.rt, "logs", key)
        assert out.returncode == 1 and f"logs: {job} was started with gmux-launch" in out.stderr, (key, out.stderr)


def test_a_runtime_directory_too_long_for_a_socket_is_refused_by_the_clients_as_by_gmuxd(tmp_path):
    """`gmux --runtime-dir LONG ps` said "gmuxd is not running ... Start it with `gmuxd --runtime-dir LONG &`",
    which gmuxd then refused: its socket's path would be over what a Unix socket allows. gmux and gmux-launch say
    so themselves."""
    long = tmp_path / ("d" * 120)
    long.mkdir()
    for cmd in ([PY, "-m", "gmux.cli.gmux", "--runtime-dir", str(long), "ps"],
                [PY, "-m", "gmux.cli.launch", "--runtime-dir", str(long), "--", "python", "x.py"]):
        out = subprocess.run(cmd, env=env(), cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert out.returncode == 2 and "a Unix socket allows, so no gmuxd can serve there" in out.stderr, out.stderr
        assert "Start it with" not in out.stderr, out.stderr
    gmuxd = subprocess.run([PY, "-m", "gmux.cli.gmuxd", "--runtime-dir", str(long), "--virtual-gpus", "1x1GiB"],
                           env=env(), cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert gmuxd.returncode != 0 and "a Unix socket allows" in gmuxd.stderr, gmuxd.stderr
