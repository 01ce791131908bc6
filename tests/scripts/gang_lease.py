"""One rank of a gang whose rank LOSER loses its lease at boundary AT (its gmuxd silent): every rank must stop at
that same boundary, none left waiting in a collective for the one that stopped.
usage: gang_lease.py OUT RANK WORLD STORE LOSER AT   (STORE: a file the ranks meet through, never a port another
process may take between its choice and the first rank's bind)
Each rank writes OUT.RANK: the boundary where its lease handler ran and the silence it was given, then exits 75
as gmux-launch's handler does."""
import json
import os
import sys

import torch
import torch.distributed as dist

from gmux.job.gang import GangController

out, store = sys.argv[1], sys.argv[4]
rank, world, loser, at = map(int, (sys.argv[2], sys.argv[3], *sys.argv[5:]))
torch.set_num_threads(1)
dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)


class Silent:
    """An agent whose gmuxd stopped answering this rank at boundary AT (the others' leases run out later)."""
    def __init__(self):
        self.on_lease_lost = None
        self.boundaries = 0

    def poll(self):
        self.boundaries += 1
        if rank == loser and self.boundaries >= at:
            self.on_lease_lost(2.5)
        return None


inner = Silent()
gang = GangController(inner)


def stop(waited: float) -> None:
    with open(f"{out}.{rank}", "w") as f:
        json.dump({"boundary": inner.boundaries, "waited": waited}, f)
    os._exit(75)


inner.on_lease_lost = stop
for step in range(at + 50):
    gang.poll()
    dist.all_reduce(torch.ones(4))        # the step's own collective
sys.exit(0)                               # not reached: the gang stops at AT
