"""A data-parallel training job over gloo (explicit mode, GangController), deterministic.
usage: gang_train.py OUT STEPS [--rank R --world W (--port P | --file F)] [--sleep S [--unpaced-when PATH]]
                     [--fail-at N] [--stray-lr-rank R] [--plain]
Without --rank, the rendezvous comes from the environment as torchrun (and gmux's cluster link) sets it: RANK,
WORLD_SIZE, MASTER_ADDR, MASTER_PORT. OUT may hold {rank}. --plain: no gmux at all, the reference run. --file: a
rendezvous through a file, which no other process can take as it can a port picked free a moment before.
--stray-lr-rank: that rank alone steps an LR scheduler attach() is not given (its learning rate never changes: the
numbers are the same), which makes that rank, and only it, unmovable (gmux.job.stray_schedulers)."""
import argparse
import hashlib
import json
import os
import time

import torch
import torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("out")
p.add_argument("steps", type=int)
p.add_argument("--rank", type=int)
p.add_argument("--world", type=int)
p.add_argument("--port", type=int)
p.add_argument("--file")
p.add_argument("--sleep", type=float, default=0.0, help="seconds per step, to pace the job against a test's moves")
p.add_argument("--unpaced-when", metavar="PATH", help="no more --sleep once PATH exists (the numbers are the same)")
p.add_argument("--fail-at", type=int, help="the last rank raises at this step (a crashed rank)")
p.add_argument("--stray-lr-rank", type=int)
p.add_argument("--plain", action="store_true")
a = p.parse_args()
torch.set_num_threads(1)
if a.rank is None:
    dist.init_process_group("gloo", init_method="env://")
else:
    dist.init_process_group("gloo", init_method=f"file://{a.file}" if a.file else f"tcp://127.0.0.1:{a.port}",
                            rank=a.rank, world_size=a.world)
rank, world = dist.get_rank(), dist.get_world_size()
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
restored_at = progress["step"]
stray = torch.optim.lr_scheduler.StepLR(opt, step_size=1 << 30) if a.stray_lr_rank == rank else None
while progress["step"] < a.steps:
    g = torch.Generator().manual_seed(progress["step"] * world + rank)
    x = torch.randn(8, 16, generator=g)
    loss = torch.nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True))
    opt.zero_grad()
    loss.backward()
    # data parallel by hand: the same sum on every rank, every step (one all_reduce of every gradient)
    grads = [q.grad for q in model.parameters()]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    flat /= world
    for g, part in zip(grads, torch.split(flat, [g.numel() for g in grads])):
        g.copy_(part.view_as(g))
    opt.step()
    if stray is not None:
        stray.step()
    progress["step"] += 1
    if progress["step"] == a.fail_at and rank == world - 1:
        raise RuntimeError(f"rank {rank} fails at step {a.fail_at}, as asked")
    if a.sleep and not (a.unpaced_when and os.path.exists(a.unpaced_when)):
        time.sleep(a.sleep)
    if job is not None:
        job.boundary()
h = hashlib.sha256()
for t in list(model.parameters()) + [opt.state[q]["momentum_buffer"] for q in model.parameters()]:
    if not torch.isfinite(t).all():
        # (every diverged run hashes the same NaNs: a test comparing hashes would compare nothing)
        raise SystemExit(f"gang_train: rank {rank} ended with weights that are not finite")
    h.update(t.detach().numpy().tobytes())
with open(a.out.format(rank=rank), "w") as f:
    json.dump({"sha256": h.hexdigest(), "steps": progress["step"], "rank": rank, "restored_at": restored_at,
               "pid": os.getpid(), "agreed": gang.agreed_at if gang else [],
               "suspends": job.profile.suspends if job else 0}, f)
dist.destroy_process_group()
