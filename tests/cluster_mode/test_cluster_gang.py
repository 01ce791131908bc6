"""Gangs through gmux-scheduler: a 2-rank gloo job submitted with --ranks 2 runs on two GPUs of one machine,
bit-identical to the same 2-rank run without gmux; moved to another machine mid-training (every rank suspended
at one step, each rank's checkpoint streamed, two new processes with a new rendezvous) it stays bit-identical
and the source's ranks are gone; its machine lost, it restarts from its last complete checkpoint set.
Received checkpoints are deleted once restored from; the scheduler keeps only the newest set."""
import json
import os
import re
import subprocess
import time

import pytest

from gmux.wire.daemon_client import Client, GmuxError
from cluster_harness import PY, ROOT, Solo, env, paced, start_py, unpace, wait_for

GANG = os.path.join(ROOT, "tests", "scripts", "gang_train.py")


def _plain(tmp_path, steps: str):
    """The reference, started: the same two ranks, no gmux, never interrupted. Called, it returns their results."""
    rendezvous = str(tmp_path / "plain.rendezvous")    # (a port picked free was once taken before rank 0 bound it)
    ps = [start_py(GANG, str(tmp_path / f"plain{r}.json"), steps, "--rank", str(r), "--world", "2", "--file",
                   rendezvous, "--plain") for r in range(2)]

    def results() -> list:
        assert [p.wait(180) for p in ps] == [0, 0]
        return [json.loads((tmp_path / f"plain{r}.json").read_text()) for r in range(2)]
    return results


def _cli(c, *args, as_json=False):
    return subprocess.run([PY, "-m", "gmux.cli.gmux", *(["--json"] if as_json else []), *args[:1],
                           "--cluster", c.endpoint, "--keys", c.keys, "--as", "tester", *args[1:]],
                          env=env(), capture_output=True, text=True, cwd=ROOT, timeout=60)


def _local(tmp_path, machine: str, cjob: str) -> dict:
    """The rank processes gmuxd of `machine` has seen for `cjob`: name -> state."""
    jobs = Client(str(tmp_path / f"rt-{machine}")).call("ps", all=True)["jobs"]
    return {j["name"]: j["state"] for j in jobs if j["name"].startswith(cjob + ".")}


def _ckpts(d) -> list:
    return sorted(f for f in os.listdir(d) if f.endswith(".ckpt")) if os.path.isdir(d) else []


def test_gang_through_the_scheduler_bit_identical_and_bad_ranks_refused(cluster_factory, tmp_path):
    steps = "600"
    c = cluster_factory(policy="gandiva", machines=("m1", "m2"))
    ref = _plain(tmp_path, steps)
    c.wait_machines(2)
    for ranks, code, problem in (("0", 2, "--ranks: 0 is not a number of ranks from 1 to 64"),     # by the CLI
                                 ("3", 1, "no machine has 3 GPUs")):                  # by the scheduler
        r = _cli(c, "submit", "--ranks", ranks, "--", PY, GANG, str(tmp_path / "x.json"), steps)
        assert r.returncode == code and problem in r.stderr, (ranks, r.stdout, r.stderr)
    # (before: accepted, and refused by gmuxd at each start until it was held)
    r = _cli(c, "submit", "--mem", "1TiB", "--", PY, GANG, str(tmp_path / "x.json"), steps)
    assert r.returncode == 1 and "--mem 1.0TiB: no machine has a GPU that large (the largest: 2.0GiB" in r.stderr, r.stderr
    r = _cli(c, "submit", "--ranks", "2", "--", PY, GANG, str(tmp_path / "gang{rank}.json"), steps, as_json=True)
    assert r.returncode == 0, r.stderr
    cjob = json.loads(r.stdout)["cjob"]
    job = wait_for(lambda: (lambda j: j["state"] in ("running", "done") and j["ranks"] and j)(c.job(cjob)), 90,
                   "the gang running")
    assert job["gpus"] == 2 and sorted(job["rank_gpus"]) == [0, 1]
    assert [r["rank"] for r in job["ranks"]] == [0, 1] and len({r["local"] for r in job["ranks"]}) == 2
    shown = _cli(c, "ps").stdout
    assert f"{cjob} " in shown and "  .0 " in shown and "  .1 " in shown, shown
    c.wait_done([cjob], 120)
    outs = [json.loads((tmp_path / f"gang{r}.json").read_text()) for r in range(2)]
    ref = ref()
    assert [o["sha256"] for o in outs] == [x["sha256"] for x in ref] and ref[0]["sha256"] == ref[1]["sha256"]
    assert [o["steps"] for o in outs] == [int(steps)] * 2
    assert _local(tmp_path, job["machine"], cjob) == {f"{cjob}.0": "exited", f"{cjob}.1": "exited"}
    assert c.ps()["internal_errors"] == 0


def test_gang_migrated_then_its_machine_lost_bit_identical_checkpoints_cleaned(cluster_factory, tmp_path):
    # A gang's step costs each rank ~1.3 ms of CPU alone, more on a loaded machine, in the gang and its reference:
    # paced at 30 ms a step until it has restarted after its machine's loss. On 2 busy cores a step took ~18 ms
    # at 4 ms of pacing (3,000: ~54 s, of which the test used ~30 before it unpaced); 1,200 at 30 ms take as long.
    steps = "1200"
    c = cluster_factory(policy="gandiva")
    ref = _plain(tmp_path, steps)
    c.wait_machines(3)
    out = str(tmp_path / "moved{rank}.json")
    cjob = c.call("c_submit", argv=[PY, GANG, out, steps, *paced(tmp_path, "0.03")], cwd=ROOT,
                  env={"OMP_NUM_THREADS": "1"}, ranks=2, ckpt_every=1.0)["cjob"]
    first = wait_for(lambda: (lambda j: j["state"] == "running" and j["step"] > 50 and j)(c.job(cjob)), 90,
                     "the gang running")
    src = first["machine"]
    dst = next(m for m in ("m1", "m2", "m3") if m != src)
    r = _cli(c, "migrate", cjob, "--machine", dst, "--gpu", "5")               # a gang's ranks go to GPUs 5, 6
    assert r.returncode == 1 and f"no GPUs 5, 6 on an up machine '{dst}'" in r.stderr, r.stderr
    r = _cli(c, "migrate", cjob, "--machine", dst, "--gpu", "0")
    assert r.returncode == 0 and f"moving {cjob} from {src} to {dst} GPU 0" in r.stdout, (r.stdout, r.stderr)
    after = wait_for(lambda: (lambda j: j["migrations"] == 1 and j["state"] == "running" and j)(c.job(cjob)), 90,
                     "migration done")
    assert after["machine"] == dst and after["rank_gpus"] == [0, 1]
    text = " ".join(d["text"] for d in c.ps()["decisions"])
    assert f"restored on {dst}" in text and f"{src} releases it" in text
    # Every rank of the source released; the target's received checkpoints deleted once both ranks restored.
    wait_for(lambda: _local(tmp_path, src, cjob) == {f"{cjob}.0": "killed", f"{cjob}.1": "killed"}, 30,
             "the source released both ranks")
    wait_for(lambda: _ckpts(tmp_path / f"rt-{dst}" / "cluster-in") == [], 30, "received checkpoints deleted")

    # A periodic checkpoint set from the new machine; the scheduler keeps the newest set only (one file a rank).
    sched_dir = tmp_path / "sched" / "checkpoints"
    at = wait_for(lambda: (lambda j: (j["ckpt_step"] or 0) > after["step"] and j)(c.job(cjob)), 60,
                  "a checkpoint set from the new machine")
    # (a set is registered once its every file has arrived, and only then is the set before it deleted: at
    # most two sets of the machine it runs on at any moment, one soon after. A set the source sent just before
    # the move can land after the new machine's first: it goes at the next registration; CI saw 3 sets once.)
    def sets(machine=""):
        return {f.rsplit(".", 2)[0] for f in _ckpts(sched_dir) if f.startswith(machine) and f"-{cjob}-" in f}
    for _ in range(20):
        assert len(sets(f"{dst}-")) <= 2, _ckpts(sched_dir)
        time.sleep(0.05)
    wait_for(lambda: len(sets()) == 1, 30, "one checkpoint set held")
    c.kill_machine(dst)
    again = wait_for(lambda: (lambda j: j["restarts"] == 1 and j["state"] in ("running", "done") and j)(c.job(cjob)),
                     90, "restarted elsewhere")
    assert again["machine"] != dst
    unpace(tmp_path)
    wait_for(lambda: _ckpts(tmp_path / f"rt-{again['machine']}" / "cluster-in") == [], 30,
             "pushed checkpoints deleted after the restore")
    jobs = c.wait_done([cjob], 180)
    outs = [json.loads(open(out.format(rank=r)).read()) for r in range(2)]
    assert [o["sha256"] for o in outs] == [x["sha256"] for x in ref()]
    assert outs[0]["restored_at"] == outs[1]["restored_at"] >= at["ckpt_step"] > 0   # one step, not scratch
    assert jobs[cjob]["migrations"] == 1 and jobs[cjob]["restarts"] == 1
    assert [f for f in _ckpts(sched_dir) if f"-{cjob}-" in f] == []       # an ended job keeps none
    assert c.ps()["internal_errors"] == 0


def test_a_crashed_rank_fails_the_whole_gang(cluster_factory, tmp_path):
    c = cluster_factory(policy="gandiva", machines=("m1",))
    c.wait_machines(1)
    cjob = c.call("c_submit", argv=[PY, GANG, str(tmp_path / "f{rank}.json"), "100000", "--sleep", "0.002",
                                    "--fail-at", "300"], cwd=ROOT, env={"OMP_NUM_THREADS": "1"}, ranks=2)["cjob"]
    job = wait_for(lambda: (lambda j: j["state"] in ("failed", "done", "killed") and j)(c.job(cjob)), 90,
                   "the gang ended")
    assert job["state"] == "failed" and job["detail"].startswith("rank "), job
    # No rank is left waiting for its dead peer, holding its GPU.
    wait_for(lambda: all(s in ("failed", "killed", "exited", "lost") for s in _local(tmp_path, "m1", cjob).values()),
             30, "every rank ended")
    assert len(_local(tmp_path, "m1", cjob)) == 2


def test_a_gang_and_a_newcomer_preempting_each_other_on_one_machine_both_end_bit_identical(cluster_factory,
                                                                                          tmp_path):
    # Tiresias with queues at 2 and 20 GPU-seconds, one machine of 2 GPUs. The gang, past the first, is
    # preempted for the single-GPU newcomer; the newcomer, past the second, for the gang in turn. Before, the
    # newcomer's start on the suspended gang's GPUs was refused at every decision (the gang stayed suspended
    # and the newcomer never ran); and a gang resuming where a suspended job waits, pinned, waited for good.
    c = cluster_factory(policy="tiresias", machines=("m1",), sched_args=("--params", '{"thresholds": [2, 20]}'))
    # (the gang paced at 15 ms a step, 12 s at least for the 800, where 2,500 at 4 ms had 13: a gang's step costs
    # each rank ~1.3 ms of CPU, in the gang and in its reference)
    steps = "800"
    ref = _plain(tmp_path, steps)
    solo = Solo(tmp_path, "new", "4000", "--batch", "40")
    c.wait_machines(1)
    out = str(tmp_path / "gang{rank}.json")
    gang = c.call("c_submit", argv=[PY, GANG, out, steps, *paced(tmp_path, "0.015")], cwd=ROOT,
                  env={"OMP_NUM_THREADS": "1"}, ranks=2)["cjob"]
    wait_for(lambda: (lambda j: j["state"] == "running" and j["step"] > 30)(c.job(gang)), 90, "the gang running")
    new = c.submit(str(tmp_path / "new.json"), "4000", "--batch", "40", *paced(tmp_path, "0.008"))

    def said(*starts):
        texts = [d["text"] for d in c.ps()["decisions"]]
        at = [next((i for i, t in enumerate(texts) if t.startswith(s)), None) for s in starts]
        return None not in at and at == sorted(at) and texts
    wait_for(lambda: said(f"suspend {gang} on m1", f"{new} -> m1 GPU", f"suspend {new} on m1", f"resume {gang} on m1"),
             120, "each preempted for the other in turn")
    # The newcomer's process gave its GPU to the gang on gmuxd, and waits to take it back.
    wait_for(lambda: any(j["name"] == new and "gave back GPU" in j["detail"]
                         for j in Client(str(tmp_path / "rt-m1")).call("ps", all=True)["jobs"]), 30,
             "the newcomer parked by gmuxd")
    assert c.job(gang)["state"] == "running"
    unpace(tmp_path)
    jobs = c.wait_done([gang, new], 180)
    assert json.loads((tmp_path / "new.json").read_text())["sha256"] == solo["sha256"]
    outs = [json.loads(open(out.format(rank=r)).read()) for r in range(2)]
    assert [o["sha256"] for o in outs] == [x["sha256"] for x in ref()] and [o["steps"] for o in outs] == [800] * 2
    assert all(jobs[j]["restarts"] == 0 and jobs[j]["migrations"] == 0 for j in (gang, new))   # resumed in place
    assert c.ps()["internal_errors"] == 0


def test_a_gang_with_one_unmovable_rank_is_not_moved_and_runs_on_as_it_was(cluster_factory, tmp_path):
    """Rank 1 alone steps an LR scheduler attach() was not given (unmovable); rank 0 is movable. Before, the
    periodic checkpoint went to rank 0 and was refused for rank 1: rank 0 held it for good (a gang carries one out
    only once every rank holds it), the link's checkpoint waited 120 s for it, and no suspend of the gang was ever
    agreed on after; and gmuxd took the attached, unmovable rank for a transparent one and refused every suspend
    of the gang, a user's or a move's. Now the checkpoint is refused for every rank before any is asked, the
    scheduler refuses the move up front (the gang's record says why), a move's suspend that reaches gmuxd anyway
    is refused there, each naming rank 1 and why; the gang runs on in the same processes, and a hold suspends and
    resumes it."""
    steps = "700"
    c = cluster_factory(policy="gandiva", machines=("m1", "m2"))
    ref = _plain(tmp_path, steps)     # (the stray scheduler keeps its learning rate: the numbers are the same)
    c.wait_machines(2)
    out = str(tmp_path / "g{rank}.json")
    cjob = c.call("c_submit", argv=[PY, GANG, out, steps, "--stray-lr-rank", "1", *paced(tmp_path, "0.03")],
                  cwd=ROOT, env={"OMP_NUM_THREADS": "1"}, ranks=2, ckpt_every=1.0)["cjob"]
    src = wait_for(lambda: (lambda j: j["state"] == "running" and j["step"] > 20 and j)(c.job(cjob)), 90,
                   "the gang running")["machine"]
    dst = next(m for m in ("m1", "m2") if m != src)
    why = "would not be restored exactly from one now: an LR scheduler attach() was not given (StepLR) drives"
    said = wait_for(lambda: next((d["text"] for d in c.ps()["decisions"] if why in d["text"]), None), 30,
                    "the periodic checkpoint refused")
    assert f"checkpoint: gang {cjob}'s rank 1 (" in said, said
    ranks = {j["name"]: j for j in Client(str(tmp_path / f"rt-{src}")).call("ps")["jobs"]}
    pids = {name: j["pid"] for name, j in ranks.items()}
    assert ranks[f"{cjob}.0"]["migratable"] and not ranks[f"{cjob}.1"]["migratable"]

    # The scheduler heard it from the gang's record: the move is refused up front, no process started for it.
    r = wait_for(lambda: (lambda r: r.returncode != 0 and r)(_cli(c, "migrate", cjob, "--machine", dst, "--gpu", "0")),
                 30, "the move refused by the scheduler")
    assert f"{cjob} would not continue exactly in a new process: rank 1: an LR scheduler attach() was not given" \
        in r.stderr, r.stderr
    # A move's suspend that reaches the machine anyway (the rank turned unmovable since its last record) is
    # refused there, naming the rank, with nothing held.
    source = Client(str(tmp_path / f"rt-{src}"))
    with pytest.raises(GmuxError, match=re.escape(f"suspend: {ranks[f'{cjob}.0']['id']} is not moved: gang {cjob}'s "
                                                  f"rank 1 (") + ".*" + re.escape(why)):
        source.call("suspend", job=ranks[f"{cjob}.0"]["id"], to_boundary=True, in_place=True, for_move=True)
    live = {j["name"]: j for j in source.call("ps")["jobs"]}
    assert {n: (j["pid"], j["state"]) for n, j in live.items()} == {n: (p, "running") for n, p in pids.items()}
    assert _local(tmp_path, dst, cjob) == {}

    c.call("c_suspend", cjob=cjob)
    wait_for(lambda: _local(tmp_path, src, cjob) == {f"{cjob}.0": "held", f"{cjob}.1": "held"}, 30,
             "the held gang suspended (its GPUs given back)")
    c.call("c_resume", cjob=cjob)
    unpace(tmp_path)
    jobs = c.wait_done([cjob], 120)
    outs = [json.loads(open(out.format(rank=r)).read()) for r in range(2)]
    assert [o["sha256"] for o in outs] == [x["sha256"] for x in ref()]
    assert [(o["steps"], o["restored_at"], o["suspends"], o["pid"]) for o in outs] == \
        [(int(steps), 0, 1, pids[f"{cjob}.{r}"]) for r in range(2)]      # suspended by the hold only
    assert jobs[cjob]["migrations"] == 0 and jobs[cjob]["restarts"] == 0
    assert c.ps()["internal_errors"] == 0
