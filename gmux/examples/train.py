"""A real training job written for gmux: `python -m gmux.examples.train --model cnn --steps 60 --out final.pt`.

Deterministic on the CPU (seeded, deterministic algorithms, one thread), so an interrupted run can be
compared bit for bit with an uninterrupted one. Options exercise the runtime:
  --suspend-at 3,9,...   suspend at these steps; a second thread resumes (and sometimes checkpoints) it
  --in-place             those suspends keep the state where it is (a cross-machine move's), copying nothing
  --migrate-at N --checkpoint PATH   at step N: checkpoint to PATH and exit (a migration's first half)
  --restore PATH         continue from a checkpoint in this new process
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import os

import torch

import gmux.job
from gmux.examples.models import build


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="cnn", choices=["cnn", "transformer"])
    p.add_argument("--steps", type=int, default=60, help="optimizer steps in all (default 60)")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--accum", type=int, default=2, help="micro-batches per optimizer step (default 2)")
    p.add_argument("--workers", type=int, default=2, help="DataLoader worker processes (default 2)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--suspend-at", default="", help="comma-separated steps at which to suspend and resume")
    p.add_argument("--in-place", action="store_true",
                   help="suspend in place (as a cross-machine move does): nothing copied out or back")
    p.add_argument("--migrate-at", type=int, default=None)
    p.add_argument("--checkpoint", default=None, help="checkpoint path for --migrate-at")
    p.add_argument("--restore", default=None)
    p.add_argument("--compile", metavar="BACKEND", default=None,
                   help="torch.compile the model with this backend (inductor, aot_eager, eager)")
    p.add_argument("--device", default="cpu", help="torch device (default cpu, a virtual GPU)")
    p.add_argument("--pool-mib", type=int, default=64, help="virtual GPU memory pool on the CPU (MiB; 0: none)")
    p.add_argument("--out", default=None, help="write final parameters, optimizer state and losses here")
    p.add_argument("--report", default=None, help="write the suspend/resume/restore figures here (JSON)")
    args = p.parse_args(argv)
    if args.migrate_at is not None and not args.checkpoint:
        p.error("--migrate-at needs --checkpoint PATH")
    try:
        args.suspend_at = {int(s) for s in args.suspend_at.split(",") if s.strip()}
    except ValueError:
        p.error(f"--suspend-at takes comma-separated step numbers, got {args.suspend_at!r}")
    return args


def _resumer(job, pending: dict, stop: threading.Event, scratch: str, cycles: list):
    """Plays the multiplexer: waits until the job is suspended, sometimes checkpoints it, resumes it."""
    controller = job.controller
    while not stop.is_set():
        command = pending.get("suspend")
        if command is None:
            stop.wait(0.001)
            continue
        result = controller.result(command, timeout=60)
        assert result["ok"], result
        if len(cycles) % 4 == 1:
            c = controller.send("checkpoint", path=os.path.join(scratch, "while-suspended.ckpt"))
            assert controller.result(c, timeout=60)["ok"]
        c = controller.send("resume")
        resumed = controller.result(c, timeout=60)
        assert resumed["ok"], resumed
        cycles.append({"suspend": result, "resume": resumed})
        pending.pop("suspend")


def main(argv=None) -> int:
    args = parse(argv)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    device = torch.device(args.device)
    if device.type == "cuda":
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS
    model, dataset, loss_fn = build(args.model, args.seed)
    model.to(device)
    if args.compile:
        model = torch.compile(model, backend=args.compile)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3, weight_decay=1e-4)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=10, gamma=0.7)
    loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch, shuffle=True, num_workers=args.workers,
                                         drop_last=True)
    pool = gmux.job.DevicePool(args.pool_mib << 20) if args.pool_mib and device.type == "cpu" else None
    state = {"step": 0, "losses": []}
    job = gmux.job.attach(model, optimizer, scheduler, state=state, pool=pool)
    restored = job.restore(args.restore) if args.restore else None
    stop, cycles, pending = threading.Event(), [], {}
    scratch = tempfile.TemporaryDirectory(prefix="gmux-train-", ignore_cleanup_errors=True)
    resumer = threading.Thread(target=_resumer, args=(job, pending, stop, scratch.name, cycles), daemon=True)
    resumer.start()
    micro = job.state["step"] * args.accum
    epochs = args.steps * args.accum // len(loader) + 2
    try:
        for _ in job.epochs(epochs):
            model.train()
            for x, y in job.data(loader):
                x, y = x.to(device), y.to(device)
                loss = loss_fn(model(x), y) / args.accum
                loss.backward()
                micro += 1
                if micro % args.accum:
                    continue
                optimizer.step()
                optimizer.zero_grad()
                scheduler.step()
                job.state["step"] += 1
                job.state["losses"].append(loss.item() * args.accum)
                step = job.state["step"]
                if step in args.suspend_at:
                    pending["suspend"] = job.controller.send("suspend", **({"in_place": True} if args.in_place
                                                                            else {}))
                if step == args.migrate_at:
                    job.controller.send("migrate", path=args.checkpoint)
                job.boundary()
                while "suspend" in pending:  # the resumer has not finished its bookkeeping yet
                    stop.wait(0.001)
                if step >= args.steps:
                    raise StopIteration
    except StopIteration:
        pass
    finally:
        stop.set()
        scratch.cleanup()          # (the job writes its checkpoints at boundaries, so none is being written now)
        if args.report:  # also when the job leaves by migrating
            with open(args.report, "w") as f:
                json.dump({"cycles": cycles, "restore": restored, "steps": job.state["step"],
                           "final_loss": job.state["losses"][-1] if job.state["losses"] else None}, f)
    print(f"trained {job.state['step']} steps, final loss {job.state['losses'][-1]:.6f}, "
          f"{len(cycles)} suspend/resume cycles", flush=True)
    if args.out:
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                    "losses": job.state["losses"], "cycles": len(cycles)}, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
