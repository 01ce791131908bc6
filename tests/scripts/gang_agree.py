"""One rank of a gang whose commands arrive as a schedule says, at the boundaries it names: what the rank's
GangController hands its runtime, and at which boundary, is written to OUT.RANK.
usage: gang_agree.py OUT RANK WORLD STORE BOUNDARIES SCHEDULE
SCHEDULE (JSON): {"RANK": {"BOUNDARY": [[KIND, TAG], ...]}}: the commands gmuxd's agent hands this rank at that
boundary, one per boundary from then on (as the agent does), each tagged so the test can tell them apart.
STORE: a file the ranks meet through (no port another process could take first)."""
import json
import sys
from collections import deque

import torch
import torch.distributed as dist

from gmux.job.control import Command
from gmux.job.gang import GangController

out, store, schedule = sys.argv[1], sys.argv[4], json.loads(sys.argv[6])
rank, world, boundaries = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[5])
torch.set_num_threads(1)
dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
mine = {int(b): cmds for b, cmds in schedule.get(str(rank), {}).items()}


class Scripted:
    """An agent handing the rank what the schedule says, one command per boundary."""
    def __init__(self):
        self.boundaries = 0
        self.queue = deque()

    def poll(self):
        self.boundaries += 1
        self.queue.extend(Command(kind, {"tag": tag}) for kind, tag in mine.get(self.boundaries, []))
        return self.queue.popleft() if self.queue else None


gang = GangController(Scripted())
acted = []
for _ in range(boundaries):
    c = gang.poll()
    if c is not None:
        acted.append([gang.boundaries, c.kind, c.args["tag"]])
    dist.all_reduce(torch.ones(4))        # the step's own collective
with open(f"{out}.{rank}", "w") as f:
    json.dump({"acted": acted, "held": sorted(gang.held)}, f)
dist.destroy_process_group()
