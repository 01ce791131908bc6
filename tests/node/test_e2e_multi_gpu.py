"""End to end: multi-GPU jobs and gangs under a real gmuxd, with real job processes on virtual GPUs.

A `--gpus 2` job gets two whole GPUs: gmuxd moves a movable job off one (defragmentation) and the moved job
time-slices with another; a 2-rank gloo gang started by `gmux submit --ranks 2` is suspended and resumed as one
by naming one rank, and while suspended gives its GPUs to another job; every job ends bit-identical to an
uninterrupted run. Bad requests are refused by name.
"""
import json
import os
import subprocess

from node_harness import PY, ROOT, TRAIN, env, paced, result, start_py, unpace

# Each step waits 3 ms (as if for input), so the jobs are still running when the events under test happen on a
# loaded machine; it changes no number.
PACE = ["--sleep", "0.003"]
GANG = os.path.join(ROOT, "tests", "scripts", "gang_train.py")


def gmux(rt, *args, timeout=60):
    return subprocess.run([PY, "-m", "gmux.cli.gmux", "--runtime-dir", rt, *args], env=env(), cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


def launch_refused(rt, *opts, script=("x.json", "10")):
    out = subprocess.run([PY, "-m", "gmux.cli.launch", "--runtime-dir", rt, *opts, "--", "python", TRAIN, *script],
                         env=env(), cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, out
    return out.stderr


def test_multi_gpu_job_gets_whole_gpus_by_moving_a_job_bit_identical(node_factory, tmp_path):
    # (1,500 steps paced at 6 and 12 ms: as long paced as 3,000 at 3 and 6 ms were, for half the steps of CPU)
    steps = "1500"
    ref = start_py(TRAIN, str(tmp_path / "solo.json"), steps, *paced(tmp_path, "0.006"))
    # (a 10 s deadline: a move that missed the 1 s default on a loaded machine would be given up and tried again)
    node = node_factory("--virtual-gpus", "3x1GiB", "--quantum", "1", "--deadline-floor", "10")
    # Slower (12 ms a step) and started together: on a loaded machine a single-GPU job paced like the others once
    # finished before the 2-GPU job had registered.
    started = {name: node.launch(TRAIN, str(tmp_path / f"{name}.json"), steps, *paced(tmp_path, "0.012"), "--attach",
                                 opts=["--no-hook", "--mem", "256MiB"]) for name in ("a", "b")}
    singles = {node.job_of(p.pid): (p, name) for name, p in started.items()}
    node.wait_for(lambda: all(node.job(j)["step"] > 100 for j in singles), 60, "both single-GPU jobs training")
    assert sorted(node.job(j)["gpu"] for j in singles) == [0, 1]
    big = node.launch(TRAIN, str(tmp_path / "big.json"), steps, *paced(tmp_path, "0.006"), opts=["--gpus", "2"])
    jbig = node.job_of(big.pid)
    node.wait_for(lambda: node.job(jbig)["state"] == "running", 90, "the 2-GPU job running")
    held = node.job(jbig)["exclusive_gpus"]
    assert len(held) == 2 and 2 in held, held
    gpus = {g["index"]: g for g in node.ps()["gpus"]}
    assert all(gpus[g]["owner"] == jbig and gpus[g]["jobs"] == [jbig] for g in held)   # no one else on them
    (moved,) = [j for j in singles if node.job(j)["migrations"] == 1]
    (other,) = set(singles) - {moved}
    node.wait_for(lambda: node.job(moved)["gpu"] == node.job(other)["gpu"], 60, "the moved job on the other's GPU")
    assert node.job(moved)["gpu"] not in held      # it time-slices with the other single-GPU job
    defrag = [d for d in node.call("decisions")["decisions"] if d["kind"] == "defrag"]
    assert len(defrag) == 1 and [m["job"] for m in defrag[0]["numbers"]["moves"]] == [moved], defrag
    assert defrag[0]["numbers"]["need"] == 2 and defrag[0]["numbers"]["free"] == [2]
    unpace(tmp_path)
    assert big.wait(180) == 0 and all(p.wait(180) == 0 for p, _ in singles.values())
    assert ref.wait(120) == 0
    solo = result(tmp_path / "solo.json")
    out = {name: result(tmp_path / f"{name}.json") for name in ("a", "b", "big")}
    assert out["big"]["devices"] == {"CUDA_VISIBLE_DEVICES": "", "GMUX_VIRTUAL_GPU": ",".join(map(str, held))}
    for name, r in out.items():
        assert r["steps"] == solo["steps"] and r["sha256"] == solo["sha256"], (name, r, solo)
    # Moved mid-run (past step 100) between virtual GPUs in its own process: nothing restored from a checkpoint.
    assert out[singles[moved][1]]["restored_at"] == 0 and out[singles[moved][1]]["pid"] == singles[moved][0].pid


def test_gang_submitted_with_ranks_suspends_and_resumes_as_one_bit_identical(node_factory, tmp_path):
    # (1,250 steps paced at 10 ms, past step 100 before the first suspend: as long running as 2,500 at 3 ms past
    # step 200 were, a step's all-reduce taking ~4 ms more, for half the steps in the ranks and the plain ones)
    steps = "1250"
    # (a rendezvous through a file: a port picked free can be taken before rank 0 binds it)
    plain = [start_py(GANG, str(tmp_path / "plain{rank}.json"), steps, "--plain", "--rank", str(r), "--world", "2",
                      "--file", str(tmp_path / "plain.rendezvous")) for r in range(2)]     # (read at the end)
    node = node_factory("--virtual-gpus", "2x1GiB", "--quantum", "1")
    sub = gmux(node.rt, "--json", "submit", "--ranks", "2", "--no-hook", "--name", "g", "--", "python", GANG,
               str(tmp_path / "gang{rank}.json"), steps, *paced(tmp_path, "0.01"))
    assert sub.returncode == 0, sub.stderr
    ranks = json.loads(sub.stdout)["jobs"]
    node.wait_for(lambda: all(node.job(j)["state"] == "running" and node.job(j)["step"] > 100 for j in ranks), 90,
                  "both ranks training")
    assert sorted(node.job(j)["gpu"] for j in ranks) == [0, 1]
    table = gmux(node.rt, "ps")
    assert "gang g 0/2" in table.stdout and "gang g 1/2" in table.stdout, table.stdout
    for cycle in range(2):
        named = ranks[cycle]             # either rank stands for the gang
        out = gmux(node.rt, "--json", "suspend", named, timeout=130)
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout)["jobs"] == ranks
        assert {node.job(j)["state"] for j in ranks} == {"held"}
        steps_held = [node.job(j)["step"] for j in ranks]
        node.wait_for(lambda: all(g["owner"] is None for g in node.ps()["gpus"]), 30, "the gang's GPUs given back")
        if cycle == 0:
            # Meanwhile another job trains on a GPU the gang gave back; resumed, the gang waits for it to end.
            guest = node.launch(TRAIN, str(tmp_path / "guest.json"), "400", *PACE)
            jguest = node.job_of(guest.pid)
            node.wait_for(lambda: node.job(jguest)["step"] > 0, 60, "the guest training on the gang's GPU")
        out = gmux(node.rt, "resume", ranks[1 - cycle])
        assert out.returncode == 0, out.stderr
        if cycle == 0:
            assert "takes back GPUs 0,1 (given back while suspended)" in out.stdout, out.stdout
            assert guest.wait(120) == 0 and result(tmp_path / "guest.json")["steps"] == 400
        node.wait_for(lambda: all(node.job(j)["step"] > s for j, s in zip(ranks, steps_held)), 60, "ranks resumed")
    unpace(tmp_path)
    node.wait_for(lambda: all(node.job(j)["state"] == "exited" for j in ranks), 180, "the gang finished")
    assert [p.wait(120) for p in plain] == [0, 0]
    outs = [result(tmp_path / f"gang{r}.json") for r in range(2)]
    ref = [result(tmp_path / f"plain{r}.json") for r in range(2)]
    assert outs[0]["sha256"] == outs[1]["sha256"] == ref[0]["sha256"] == ref[1]["sha256"]
    assert outs[0]["suspends"] == outs[1]["suspends"] == 2
    assert outs[0]["agreed"] == outs[1]["agreed"]         # both ranks suspended at the same boundaries


def test_bad_multi_gpu_and_gang_requests_are_refused_by_name(node_factory, tmp_path):
    node = node_factory("--virtual-gpus", "2x1GiB")
    assert "argument --gpus: 0 is not a positive integer" in launch_refused(node.rt, "--gpus", "0")
    said = launch_refused(node.rt, "--gpus", "3")    # (the request named once: "refused register: register: ...")
    assert "gmux-launch: gmuxd refused register: the job asks for 3 GPUs; this machine has 2" in said, said
    assert "--rank 2 --world 2: the rank must be in 0..WORLD-1" in launch_refused(
        node.rt, "--gang", "g", "--rank", "2", "--world", "2")
    assert "needs all of --gang NAME, --rank R and --world N" in launch_refused(node.rt, "--gang", "g")
    # A rank whose gang size disagrees with the rank already registered.
    first = node.launch(TRAIN, str(tmp_path / "r0.json"), "10", opts=["--gang", "g", "--rank", "0", "--world", "2"])
    node.job_of(first.pid)
    assert "gang g has 2 ranks" in launch_refused(node.rt, "--gang", "g", "--rank", "1", "--world", "3")
    out = gmux(node.rt, "submit", "--gpus", "0", "--", "python", TRAIN, "x.json", "10")
    assert out.returncode == 2 and "--gpus: 0 is not a positive integer" in out.stderr
    out = gmux(node.rt, "submit", "--ranks", "3", "--", "python", TRAIN, "x.json", "10")
    # (in the user's words: the gang's id, gmuxd's choice, was shown nowhere)
    assert out.returncode == 1 and "--ranks 3: this machine has" in out.stderr, out.stderr
    assert "gang" not in out.stderr and "each rank needs a GPU of its own" in out.stderr, out.stderr


def test_a_held_gang_that_never_reaches_a_boundary_computes_no_more(node_factory, tmp_path):
    """An unmodified gang (its ranks run with no hook and no GangController: every cluster start is so) never
    reaches a boundary, and a gang's rank is never stopped for others' turns: a suspend said "held" while both
    ranks trained on, and on a machine cut off from its scheduler the gang trained in two places at once. Held,
    every rank is stopped now, and continued when resumed."""
    def states(ranks):
        return [open(f"/proc/{node.job(j)['pid']}/stat").read().rsplit(")", 1)[1].split()[0] for j in ranks]
    node = node_factory("--virtual-gpus", "2x1GiB")
    spin = os.path.join(ROOT, "tests", "node", "spin_job.py")
    sub = gmux(node.rt, "--json", "submit", "--ranks", "2", "--no-hook", "--name", "g", "--", "python", spin)
    assert sub.returncode == 0, sub.stderr
    ranks = json.loads(sub.stdout)["jobs"]
    node.wait_for(lambda: all(node.job(j)["state"] == "running" for j in ranks), 90, "both ranks running")
    out = gmux(node.rt, "--json", "suspend", "g", timeout=60)
    assert out.returncode == 0 and json.loads(out.stdout)["kind"] == "stop", (out.stdout, out.stderr)
    node.wait_for(lambda: states(ranks) == ["T", "T"], 20, lambda: states(ranks))
    assert gmux(node.rt, "resume", "g").returncode == 0
    node.wait_for(lambda: "T" not in states(ranks), 20, lambda: states(ranks))
    # A cut-off machine's fence asks as the cluster link does: a suspend with a deadline, taken only once done
    from gmux.wire.daemon_client import Client
    c = Client(node.rt)
    try:
        assert c.call("suspend", timeout=30, job=ranks[1], deadline_s=0.5)["kind"] == "stop"
    finally:
        c.close()
    node.wait_for(lambda: states(ranks) == ["T", "T"], 20, lambda: states(ranks))
    assert gmux(node.rt, "kill", "g").returncode == 0


def test_a_rank_killed_from_outside_is_told_as_it_ended_and_its_peer_as_killed_for_it(node_factory, tmp_path):
    """kill -9 of rank 1: rank 0, its connection reset, ended "failed" in the same look, was handled first, and
    rank 1 was then said "killed: rank 0 of its gang failed"; or, reaped the other way round, rank 0 killed by
    gmuxd as rank 1's peer was said "lost: killed by a signal from outside gmux" (an outside tester)."""
    import signal
    node = node_factory("--virtual-gpus", "2x1GiB")
    sub = gmux(node.rt, "--json", "submit", "--ranks", "2", "--no-hook", "--name", "g", "--", "python", GANG,
               str(tmp_path / "gang{rank}.json"), "100000", *PACE)
    assert sub.returncode == 0, sub.stderr
    ranks = json.loads(sub.stdout)["jobs"]
    node.wait_for(lambda: all(node.job(j)["step"] > 5 for j in ranks), 90, "both ranks training")
    os.kill(node.job(ranks[1])["pid"], signal.SIGKILL)
    node.wait_for(lambda: all(node.job(j)["state"] in ("failed", "killed", "lost") for j in ranks), 60, "ended")
    r0, r1 = (node.job(j) for j in ranks)
    assert "of its gang" not in r1["detail"] and "signal 9" in r1["detail"], r1
    assert r0["state"] != "lost" and "outside gmux" not in r0["detail"], r0
