"""A small deterministic training script used by the node tests and the demo.

usage: train.py OUT STEPS [--hidden H] [--depth D] [--batch B] [--sleep S] [--threads T] [--attach]
                [--frozen-mib M] [--boundary-log PATH]
Writes OUT as JSON: the final parameters' sha256 and loss, so runs can be compared bit for bit.
Plain torch by default (what gmux-launch's transparent mode runs); --attach uses gmux.job.attach() with the
launcher's controller and restores from GMUX_RESTORE after a migration (explicit mode, gmux-launch --no-hook).
Batch i is drawn from a generator seeded with i, so the data depends only on the step count.
--sleep stands for a job that waits on input each mini-batch (it leaves the CPU free: packing gains).
"""
import argparse
import fcntl
import hashlib
import json
import os
import sys
import time

import torch

p = argparse.ArgumentParser()
p.add_argument("out")
p.add_argument("steps", type=int)
p.add_argument("--hidden", type=int, default=64)
p.add_argument("--batch", type=int, default=32)
p.add_argument("--sleep", type=float, default=0.0)
p.add_argument("--threads", type=int, default=1)
p.add_argument("--lr", type=float, default=0.01, help="SGD's learning rate (wide models need a smaller one)")
p.add_argument("--depth", type=int, default=0, help="extra hidden layers (more compute per mini-batch)")
p.add_argument("--frozen-mib", type=float, default=0.0,
               help="a frozen embedding table of this size (requires_grad False, the same in every process "
                    "that builds it) whose rows are added to the input: a job most of whose bytes training "
                    "leaves alone, as a fine-tuned head over a pretrained backbone")
p.add_argument("--attach", action="store_true")
p.add_argument("--exclusive", action="store_true",
               help="compute holding the virtual GPU's lock: a job that saturates its device, as a kernel using "
                    "all SMs does; two such jobs packed on one GPU take turns (on a busy shared CPU, core "
                    "contention alone is too noisy to show interference reliably). The lock is released before "
                    "each boundary, where the job may be suspended: before the optimizer step in transparent mode "
                    "(its hook is the boundary), after it with --attach")
p.add_argument("--device-time", type=float, default=0.0, metavar="S",
               help="with --exclusive (or once --exclusive-when's file exists): hold the virtual GPU's lock S "
                    "seconds more each mini-batch, as a kernel keeps the device busy while the CPU waits (a "
                    "saturating job that leaves the CPU to the others)")
p.add_argument("--unpaced-when", metavar="PATH",
               help="from when PATH exists on: stop sleeping (a test that has measured what the pacing was for "
                    "lets the rest run at full speed; the numbers do not depend on it)")
p.add_argument("--exclusive-when", metavar="PATH",
               help="from when PATH exists on: stop sleeping and compute as --exclusive (a job whose phase changes, "
                    "so a kept pack stops gaining)")
p.add_argument("--boundary-log", metavar="PATH",
               help="append 'TIME PID STEP' at every boundary (a benchmark reads a move's downtime from it: the "
                    "last line of one process to the first of the next), and 'TIME PID start' and 'TIME PID "
                    "built' around the model's build")
a = p.parse_args()
boundary_log = open(a.boundary_log, "a", buffering=1) if a.boundary_log else None
if boundary_log:
    boundary_log.write(f"{time.time():.6f} {os.getpid()} start\n")
torch.set_num_threads(a.threads)
torch.manual_seed(0)
layers = [torch.nn.Linear(32, a.hidden), torch.nn.ReLU()]
for _ in range(a.depth):
    layers += [torch.nn.Linear(a.hidden, a.hidden), torch.nn.ReLU()]
model = torch.nn.Sequential(*layers, torch.nn.Linear(a.hidden, 1))
table = None
if a.frozen_mib:
    table = torch.nn.Embedding(max(1, int(a.frozen_mib * (1 << 20) / (32 * 4))), 32)
    table.weight.requires_grad_(False)
    model = torch.nn.ModuleDict({"table": table, "body": model})
trained = [q for q in model.parameters() if q.requires_grad]
opt = torch.optim.SGD(trained, lr=a.lr, momentum=0.9)
if boundary_log:
    boundary_log.write(f"{time.time():.6f} {os.getpid()} built\n")
progress = {"step": 0}
job = None
if a.attach:
    import gmux.job
    job = gmux.job.attach(model, opt, state=progress)  # gmuxd's controller; restores after a migration
restored_at = progress["step"]
device_lock = None
saturating = False     # --exclusive-when's file has appeared
unpaced = False        # --unpaced-when's file has appeared


def lock_device():
    global device_lock
    device_lock = open(os.path.join(os.environ.get("GMUX_RUNTIME_DIR", "/tmp"),
                                    f"vgpu{os.environ.get('GMUX_VIRTUAL_GPU', 'x')}.lock"), "w")


if a.exclusive:
    lock_device()
loss = None
while progress["step"] < a.steps:
    if a.exclusive_when and not saturating and os.path.exists(a.exclusive_when):
        lock_device()
        saturating = True
    if a.unpaced_when and not unpaced:
        unpaced = os.path.exists(a.unpaced_when)
    if a.sleep and not saturating and not unpaced:
        time.sleep(a.sleep)
    if device_lock:
        fcntl.flock(device_lock, fcntl.LOCK_EX)
    x = torch.randn(a.batch, 32, generator=torch.Generator().manual_seed(progress["step"]))
    y = x.sum(dim=1, keepdim=True)
    if table is not None:
        rows = torch.randint(0, table.num_embeddings, (a.batch,),
                             generator=torch.Generator().manual_seed(progress["step"]))
        x = x + table(rows)
    loss = torch.nn.functional.mse_loss((model["body"] if table is not None else model)(x), y)
    opt.zero_grad()
    loss.backward()
    if device_lock and a.device_time:
        time.sleep(a.device_time)
    if device_lock and job is None:
        fcntl.flock(device_lock, fcntl.LOCK_UN)   # transparent mode: the step's hook is the boundary
    opt.step()
    if device_lock and job is not None:
        fcntl.flock(device_lock, fcntl.LOCK_UN)   # attached: the boundary is job.boundary(), below
    if not torch.isfinite(loss):
        # (every diverged run hashes the same NaNs: a test comparing hashes would compare nothing)
        sys.exit(f"demo_train: the loss is {loss.item()} at step {progress['step']}: give a smaller --lr")
    progress["step"] += 1
    if boundary_log:
        boundary_log.write(f"{time.time():.6f} {os.getpid()} {progress['step']}\n")
    if job is not None:
        job.boundary()
h = hashlib.sha256()
for t in list(model.parameters()) + [opt.state[q]["momentum_buffer"] for q in trained]:
    h.update(t.detach().numpy().tobytes())
with open(a.out, "w") as f:
    json.dump({"sha256": h.hexdigest(), "loss": float(loss.detach()) if loss is not None else None,
               "steps": progress["step"], "pid": os.getpid(), "restored_at": restored_at,
               "devices": {k: os.environ.get(k) for k in ("CUDA_VISIBLE_DEVICES", "GMUX_VIRTUAL_GPU")}}, f)
