"""A gang stops as one when any rank's lease runs out (its gmuxd silent): each rank stopping at its own boundary
left the others waiting in the step's collective for the one that had gone, until gloo's or NCCL's timeout."""
import json
import os
import subprocess

from gmux_testkit import ROOT, start_py

SCRIPT = os.path.join(ROOT, "tests", "scripts", "gang_lease.py")


def test_every_rank_stops_at_the_boundary_where_one_lost_its_lease(tmp_path):
    out = str(tmp_path / "stopped")
    world, loser, at = 3, 1, 4
    store = str(tmp_path / "store")
    ranks = [start_py(SCRIPT, out, str(r), str(world), store, str(loser), str(at), log=str(tmp_path / f"r{r}"))
             for r in range(world)]
    try:
        codes = [p.wait(timeout=60) for p in ranks]
    except subprocess.TimeoutExpired:
        codes = [p.poll() for p in ranks]
    finally:
        for p in ranks:
            if p.poll() is None:
                p.kill()
    logs = "\n".join(f"rank {r}:\n" + (tmp_path / f"r{r}").read_text() for r in range(world))
    assert codes == [75] * world, logs
    stopped = [json.loads(open(f"{out}.{r}").read()) for r in range(world)]
    assert [s["boundary"] for s in stopped] == [at] * world
    assert all(abs(s["waited"] - 2.5) < 0.01 for s in stopped), stopped
