"""End to end: `gmux-launch -- torchrun --nproc_per_node 2 train.py` under a real gmuxd on virtual GPUs runs an
unmodified DDP (gloo) script as one gang: both ranks registered, hooked and placed together; suspended and
resumed as one (the ranks agree on the boundary), ending bit-identical to a plain torchrun run; killed as one."""
import json
import os
import signal
import subprocess

from node_harness import PY, ROOT, env, paced, result, unpace

DDP = os.path.join(ROOT, "tests", "scripts", "ddp_train.py")
TORCHRUN = os.path.join(os.path.dirname(PY), "torchrun")
RANKS = ["--standalone", "--nproc_per_node", "2"]
# Each step waits 20 ms, so the gang is still training when the test suspends it on a loaded machine; it
# changes no number. (The bit-identical runs: 350 steps, past step 15 when suspended, as long paced as 700 at
# 10 ms past step 30 were, for half the steps, each an all-reduce, in the ranks and in the plain ones.)
SLEEP = "0.02"
STEPS, STARTED = "350", 15


def gmux(rt, *args, timeout=60):
    return subprocess.run([PY, "-m", "gmux.cli.gmux", "--runtime-dir", rt, *args], env=env(), cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


def _launch(node, name, out, steps):
    log = open(node.tmp / f"{name}.log", "ab")
    p = subprocess.Popen([PY, "-m", "gmux.cli.launch", "--runtime-dir", node.rt, "--name", name, "--", TORCHRUN,
                          *RANKS, DDP, out, steps, *paced(node.tmp, SLEEP)], env=env(), cwd=ROOT, stdout=log,
                         stderr=subprocess.STDOUT, start_new_session=True)
    node.procs.append(p)
    return p


def _plain(tmp_path, steps):
    """The reference: the same script under a plain torchrun, its output in plain.log."""
    with open(tmp_path / "plain.log", "ab") as log:
        return subprocess.Popen([PY, "-m", "torch.distributed.run", *RANKS, DDP, str(tmp_path / "plain{rank}.json"),
                                 steps], env=env(), cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)


def _plain_done(plain, tmp_path, steps):
    """The reference ended well, run again once if it did not: --standalone takes a free port by closing it, and
    another test's process may take it first (CI: exit 1, beside the gang's bit-identical run under gmux)."""
    if plain.wait(120) != 0:
        assert _plain(tmp_path, steps).wait(300) == 0, (tmp_path / "plain.log").read_text()[-3000:]


def _ranks(node, name):
    jobs = [j for j in node.ps()["jobs"] if (j.get("gang") or {}).get("id") == name]
    return sorted(jobs, key=lambda j: j["gang"]["rank"])


def _training(node, name, past):
    ranks = _ranks(node, name)
    return len(ranks) == 2 and all(j["state"] == "running" and j["step"] > past for j in ranks)


def test_torchrun_gang_suspends_and_resumes_as_one_bit_identical(node_factory, tmp_path):
    steps = STEPS
    plain = _plain(tmp_path, steps)
    node = node_factory("--virtual-gpus", "2x1GiB", "--quantum", "1")
    launcher = _launch(node, "tr", str(tmp_path / "gang{rank}.json"), steps)
    node.wait_for(lambda: _training(node, "tr", STARTED), 90, "both torchrun ranks training under gmuxd")
    ranks = [j["id"] for j in _ranks(node, "tr")]
    assert sorted(node.job(j)["gpu"] for j in ranks) == [0, 1]
    table = gmux(node.rt, "ps").stdout
    assert "gang tr 0/2" in table and "gang tr 1/2" in table and "optimizer hook" in table, table
    out = gmux(node.rt, "--json", "suspend", ranks[0], timeout=130)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["jobs"] == ranks
    held = [node.job(j)["step"] for j in ranks]
    assert {node.job(j)["state"] for j in ranks} == {"held"}
    assert held[0] == held[1]                       # both stopped at the same boundary
    out = gmux(node.rt, "resume", ranks[1])
    assert out.returncode == 0, out.stderr
    node.wait_for(lambda: all(node.job(j)["step"] > s for j, s in zip(ranks, held)), 60, "the gang resumed")
    unpace(tmp_path)
    assert launcher.wait(120) == 0
    _plain_done(plain, tmp_path, steps)
    digests = {result(tmp_path / f"{kind}{r}.json")["sha256"] for kind in ("plain", "gang") for r in range(2)}
    assert len(digests) == 1
    assert all(node.job(j)["state"] == "exited" and node.job(j)["suspends"] == 1 for j in ranks)


def test_torchrun_gang_is_killed_as_one(node_factory, tmp_path):
    node = node_factory("--virtual-gpus", "2x1GiB", "--quantum", "1")
    launcher = _launch(node, "tk", str(tmp_path / "k{rank}.json"), "100000")
    node.wait_for(lambda: _training(node, "tk", 5), 90, "both torchrun ranks training under gmuxd")
    ranks = [j["id"] for j in _ranks(node, "tk")]
    out = gmux(node.rt, "kill", ranks[1])
    assert out.returncode == 0, out.stderr
    launcher.wait(60)                       # torchrun and both workers are gone
    node.wait_for(lambda: all(node.job(j)["state"] in ("exited", "killed") for j in ranks), 30, "both ranks ended")
    assert not os.path.exists(tmp_path / "k0.json") and not os.path.exists(tmp_path / "k1.json")


def test_an_unmodified_ddp_script_submitted_with_ranks_suspends_as_one_bit_identical(node_factory, tmp_path):
    """`gmux submit --ranks 2 -- python ddp.py` (no --no-hook): each rank ran hooked without agreeing with its
    peer, so gmux suspend was refused ("ranks in transparent mode ... cannot agree on a boundary"), while gmux ps
    said they could be suspended (an outside-user review). Now they agree, as torchrun's ranks do."""
    steps = STEPS
    plain = _plain(tmp_path, steps)
    node = node_factory("--virtual-gpus", "2x1GiB", "--quantum", "1")
    sub = gmux(node.rt, "--json", "submit", "--ranks", "2", "--name", "sg", "--", "python", DDP,
               str(tmp_path / "gang{rank}.json"), steps, *paced(tmp_path, SLEEP))
    assert sub.returncode == 0, sub.stderr
    ranks = json.loads(sub.stdout)["jobs"]
    node.wait_for(lambda: all(node.job(j)["state"] == "running" and node.job(j)["step"] > STARTED for j in ranks),
                  90, "both ranks training")
    out = gmux(node.rt, "--json", "suspend", ranks[1], timeout=130)
    assert out.returncode == 0, out.stderr
    held = [node.job(j)["step"] for j in ranks]
    assert {node.job(j)["state"] for j in ranks} == {"held"} and held[0] == held[1]
    assert gmux(node.rt, "resume", ranks[0]).returncode == 0
    unpace(tmp_path)
    node.wait_for(lambda: all(node.job(j)["state"] == "exited" for j in ranks), 120, "the gang finished")
    _plain_done(plain, tmp_path, steps)
    digests = {result(tmp_path / f"{kind}{r}.json")["sha256"] for kind in ("plain", "gang") for r in range(2)}
    assert len(digests) == 1


def test_a_held_torchrun_gang_told_to_end_ends_each_rank_with_a_record(node_factory, tmp_path):
    """`kill`, a batch system's preemption or Ctrl-C reaches gmux-launch and torchrun, and torchrun passes a signal
    on to its workers (SIGTERM, or the SIGINT it got: that one was recorded already): held ranks, whose script has
    no handler for SIGTERM, were recorded "lost ... killed by a signal from outside gmux". Each says what ended
    it, and when."""
    node = node_factory("--virtual-gpus", "2x1GiB", "--quantum", "1")
    said = "ended by SIGTERM while suspended by gmuxd, which the script has no handler for"
    launcher = _launch(node, "tt", str(tmp_path / "tt{rank}.json"), "100000")
    node.wait_for(lambda: _training(node, "tt", 5), 90, "both torchrun ranks training under gmuxd")
    ranks = [j["id"] for j in _ranks(node, "tt")]
    assert gmux(node.rt, "suspend", ranks[0], timeout=130).returncode == 0
    os.killpg(launcher.pid, signal.SIGTERM)
    assert launcher.wait(60) != 0
    node.wait_for(lambda: all(node.job(j)["state"] in ("failed", "killed") for j in ranks), 30, "ranks ended")
    ended = [node.job(j) for j in ranks]    # (one gmuxd ends first, as its peer failed, may say that instead)
    assert any(j["detail"] == said for j in ended), ended
    assert all(said in j["detail"] or "of its gang failed" in j["detail"] for j in ended), ended
