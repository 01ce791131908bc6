"""A deterministic data-parallel gloo job, one rank per process, as `gmux submit --ranks N` starts it: rank,
world size and rendezvous come from the environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT).

usage: gang_env_train.py OUT_PREFIX STEPS [--sleep S] [--plain]   writes OUT_PREFIX{RANK}.json
Explicit mode (gmux.job.attach with a GangController, so every rank carries out a command at the same step);
--plain runs without gmux (the reference). --sleep S waits S seconds per step, as if for input: it paces the
job so a fast machine cannot finish before the events a test waits for, and changes no number.
"""
import argparse
import hashlib
import json
import os
import time

import torch
import torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("prefix")
p.add_argument("steps", type=int)
p.add_argument("--sleep", type=float, default=0.0)
p.add_argument("--plain", action="store_true")
a = p.parse_args()
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
torch.set_num_threads(1)
dist.init_process_group("gloo", rank=rank, world_size=world)   # env:// rendezvous
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
progress = {"step": 0}
job = gang = None
if not a.plain:
    import gmux.job
    from gmux.job import control
    from gmux.job.gang import GangController
    gang = GangController(control.default())
    job = gmux.job.attach(model, opt, state=progress, controller=gang)
while progress["step"] < a.steps:
    if a.sleep:
        time.sleep(a.sleep)
    g = torch.Generator().manual_seed(progress["step"] * world + rank)
    x = torch.randn(8, 16, generator=g)
    loss = torch.nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True))
    opt.zero_grad()
    loss.backward()
    for q in model.parameters():          # data parallel by hand: the same sum on every rank, every step
        dist.all_reduce(q.grad)
        q.grad /= world
    opt.step()
    progress["step"] += 1
    if job is not None:
        job.boundary()
h = hashlib.sha256()
for t in list(model.parameters()) + [opt.state[q]["momentum_buffer"] for q in model.parameters()]:
    h.update(t.detach().numpy().tobytes())
with open(f"{a.prefix}{rank}.json", "w") as f:
    json.dump({"sha256": h.hexdigest(), "steps": progress["step"], "rank": rank,
               "agreed": gang.agreed_at if gang else [], "suspends": job.profile.suspends if job else 0}, f)
dist.destroy_process_group()
