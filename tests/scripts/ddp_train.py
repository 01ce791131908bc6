"""An ordinary DistributedDataParallel training script over gloo, started by torchrun (RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT from its environment), knowing nothing of gmux; deterministic.
usage: ddp_train.py OUT STEPS [--sleep S [--unpaced-when PATH]]   (OUT may hold {rank}; each rank writes the digest of its state)"""
import argparse
import hashlib
import json
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

p = argparse.ArgumentParser()
p.add_argument("out")
p.add_argument("steps", type=int)
p.add_argument("--sleep", type=float, default=0.0, help="seconds per step, to pace the job against a test's moves")
p.add_argument("--unpaced-when", metavar="PATH", help="no more --sleep once PATH exists (the numbers are the same)")
a = p.parse_args()
torch.set_num_threads(1)
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
for step in range(a.steps):
    g = torch.Generator().manual_seed(step * world + rank)
    x = torch.randn(8, 16, generator=g)
    loss = torch.nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True))
    opt.zero_grad()
    loss.backward()
    opt.step()
    if a.sleep and not (a.unpaced_when and os.path.exists(a.unpaced_when)):
        time.sleep(a.sleep)
h = hashlib.sha256()
for t in list(model.parameters()) + [opt.state[q]["momentum_buffer"] for q in model.parameters()]:
    if not torch.isfinite(t).all():
        # (every diverged run hashes the same NaNs: a test comparing hashes would compare nothing)
        raise SystemExit(f"ddp_train: rank {rank} ended with weights that are not finite")
    h.update(t.detach().numpy().tobytes())
with open(a.out.format(rank=rank), "w") as f:
    json.dump({"sha256": h.hexdigest(), "steps": a.steps, "rank": rank}, f)
# The reference run, which gmux never touches, once aborted in CI at gloo's teardown ("terminate called
# without an active exception"). With a barrier first, neither rank closes its pairs while the other may still
# be using them.
dist.barrier()
dist.destroy_process_group()
