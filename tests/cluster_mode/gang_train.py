"""A 2-rank data-parallel training job over gloo (explicit mode, GangController), deterministic.
usage: gang_train.py OUT RANK WORLD PORT STEPS [--plain]   (--plain: no gmux at all, the reference run)"""
import hashlib
import json
import sys

import torch
import torch.distributed as dist

out, rank, world, port, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
plain = "--plain" in sys.argv
torch.set_num_threads(1)
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
progress = {"step": 0}
job = gang = None
if not plain:
    import gmux.job
    from gmux.job import control
    from gmux.job.gang import GangController
    gang = GangController(control.default())
    job = gmux.job.attach(model, opt, state=progress, controller=gang)
while progress["step"] < steps:
    g = torch.Generator().manual_seed(progress["step"] * world + rank)
    x = torch.randn(8, 16, generator=g)
    loss = torch.nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True))
    opt.zero_grad()
    loss.backward()
    for p in model.parameters():          # data parallel by hand: the same sum on every rank, every step
        dist.all_reduce(p.grad)
        p.grad /= world
    opt.step()
    progress["step"] += 1
    if job is not None:
        job.boundary()
h = hashlib.sha256()
for t in list(model.parameters()) + [opt.state[q]["momentum_buffer"] for q in model.parameters()]:
    h.update(t.detach().numpy().tobytes())
with open(out, "w") as f:
    json.dump({"sha256": h.hexdigest(), "steps": progress["step"], "rank": rank,
               "agreed": gang.agreed_at if gang else [], "suspends": job.profile.suspends if job else 0}, f)
dist.destroy_process_group()
