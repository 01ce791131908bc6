"""A gang stops as one when any rank's lease runs out (its gmuxd silent): each rank stopping at its own boundary
left the others waiting in the step's collective for the one that had gone, until gloo's or NCCL's timeout."""
import json
import os

from gmux_testkit import ROOT, run_ranks

SCRIPT = os.path.join(ROOT, "tests", "scripts", "gang_lease.py")


def test_every_rank_stops_at_the_boundary_where_one_lost_its_lease(tmp_path):
    out = str(tmp_path / "stopped")
    world, loser, at = 3, 1, 4
    store = str(tmp_path / "store")
    codes, logs = run_ranks(SCRIPT, world, tmp_path, lambda r: (out, str(r), str(world), store, str(loser), str(at)))
    assert codes == [75] * world, logs
    stopped = [json.loads(open(f"{out}.{r}").read()) for r in range(world)]
    assert [s["boundary"] for s in stopped] == [at] * world
    assert all(abs(s["waited"] - 2.5) < 0.01 for s in stopped), stopped
