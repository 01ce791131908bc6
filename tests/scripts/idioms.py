"""Plain-PyTorch training idioms around an attached job (explicit mode), one chosen by flag, moved into a new process
at a step or not; what the run ends with is saved for a bit-for-bit comparison (tests/test_idioms.py).

usage: idioms.py OUT IDIOM [--migrate-at STEP --checkpoint PATH] [--restore PATH]

IDIOM:
  scaler-attached, scaler-stray: a GradScaler (on the CPU) whose scale starts too high, so that its first steps are
      skipped, and grows every 3 steps; attached, or not;
  ema-rebound: an EMA of the weights kept as a dict of tensors passed in extras=, its entries made anew each step
      (ema[k] = d * ema[k] + (1 - d) * p), not updated in place;
  ema-inplace: the same, updated in place (lerp_);
  ema-stray, ema-list-stray, best-state: the in-place EMA dict not given to attach(); an EMA kept as a list of
      tensors, not given; the best epoch's weights kept as a copy of the model's state_dict() (early stopping's);
  float-stat, tensor-stat: the model's forward keeps a running statistic of its input in a plain attribute (a Python
      float; a tensor made anew at each call) and divides by it;
  fused-adam, tensor-lr: Adam(fused=True); Adam with its learning rate a tensor;
  swa: an AveragedModel and SWALR after a cosine schedule, all attached, swapped at step 18 (swa-stray: the
      AveragedModel not attached);
  plateau, onecycle, sequential, chained, lambda: ReduceLROnPlateau stepped by the epoch's mean loss (epochs of
      4 steps), OneCycleLR, SequentialLR(LinearLR, ExponentialLR), ChainedScheduler(ExponentialLR, CyclicLR),
      LambdaLR with a closure over a warmup length: each attached;
  bf16-clip: autocast to bfloat16 on the CPU, gradients clipped by norm;
  accum: 3 batches per step, counted by job.enumerate's index, the script marking its own boundaries;
  accum-fetch: the same, the boundaries job.data's fetches (--migrate-at counts batches: a move asked for
      mid-accumulation);
  pairs: two batches per step, the second fetched by the loop's own next() (--migrate-at counts steps: a move asked
      for between the two fetches).
"""
import argparse
import sys

import torch

import gmux.job


class Net(torch.nn.Module):
    """A model whose forward divides its input by a running mean of its magnitude, kept in a plain attribute."""

    def __init__(self, as_tensor: bool):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
        self.stat = torch.tensor(1.0) if as_tensor else 1.0

    def forward(self, x):
        if self.training:
            m = x.detach().abs().mean()
            self.stat = 0.9 * self.stat + 0.1 * (m if isinstance(self.stat, torch.Tensor) else float(m))
        return self.body(x / self.stat)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("idiom")
    p.add_argument("--migrate-at", type=int)
    p.add_argument("--checkpoint")
    p.add_argument("--restore")
    a = p.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    if a.idiom.endswith("-stat"):
        model = Net(a.idiom == "tensor-stat")
    else:
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    if a.idiom in ("fused-adam", "tensor-lr"):
        opt = torch.optim.Adam(model.parameters(), lr=torch.tensor(0.01) if a.idiom == "tensor-lr" else 0.01,
                               fused=a.idiom == "fused-adam")
    else:
        opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    sched = swa = swa_sched = None
    S = torch.optim.lr_scheduler
    if a.idiom.startswith("swa"):
        sched = S.CosineAnnealingLR(opt, T_max=18)
        swa = torch.optim.swa_utils.AveragedModel(model)
        swa_sched = torch.optim.swa_utils.SWALR(opt, swa_lr=0.01, anneal_epochs=4)
    elif a.idiom == "plateau":
        sched = S.ReduceLROnPlateau(opt, factor=0.5, patience=0, threshold=0.5)
    elif a.idiom == "onecycle":
        sched = S.OneCycleLR(opt, max_lr=0.05, total_steps=40)
    elif a.idiom == "sequential":
        sched = S.SequentialLR(opt, [S.LinearLR(opt, 0.1, total_iters=5), S.ExponentialLR(opt, 0.95)], [5])
    elif a.idiom == "chained":
        sched = S.ChainedScheduler([S.ExponentialLR(opt, 0.97), S.CyclicLR(opt, 0.005, 0.03, step_size_up=4)])
    elif a.idiom == "lambda":
        warmup = 6
        sched = S.LambdaLR(opt, lambda step: min(1.0, (step + 1) / warmup))
    x = torch.randn(32 if a.idiom == "plateau" else 96, 8)     # (plateau: epochs of 4 steps)
    y = x.sum(1, keepdim=True)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8, shuffle=True,
                                         generator=torch.Generator().manual_seed(1))
    objects, extras, out = [model, opt], None, {}
    scaler = ema = None
    if a.idiom.startswith("scaler"):
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 127, growth_interval=3)
        if a.idiom == "scaler-attached":
            objects.append(scaler)
    elif a.idiom.startswith("ema"):
        ema = {k: v.detach().clone() for k, v in model.state_dict().items()}
        extras = None if a.idiom.endswith("stray") else ema
    best = {"loss": float("inf"), "weights": None}
    ema_list = [p.detach().clone() for p in model.parameters()]
    objects += [o for o in (sched, None if a.idiom == "swa-stray" else swa, swa_sched) if o is not None]
    job = gmux.job.attach(*objects, extras=extras, state={"step": 0, "skipped": 0, "losses": []})
    if a.restore:
        job.restore(a.restore)
    accum = 3 if a.idiom.startswith("accum") else 1
    for _ in job.epochs(9 if a.idiom == "plateau" else 3):
        if a.idiom == "pairs":
            it = iter(job.data(loader))
            for xa, ya in it:
                if len(job.state["losses"]) == a.migrate_at:
                    job.controller.send("migrate", path=a.checkpoint)
                xb, yb = next(it, (None, None))
                if xb is None:
                    break
                loss = torch.nn.functional.mse_loss(model(torch.cat([xa, xb])), torch.cat([ya, yb]))
                job.state["losses"].append(loss.item())
                loss.backward()
                opt.step()
                opt.zero_grad()
            continue
        for i, (xb, yb) in job.enumerate(loader):
            if a.idiom == "bf16-clip":
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    loss = torch.nn.functional.mse_loss(model(xb).float(), yb)
            else:
                loss = torch.nn.functional.mse_loss(model(xb), yb)
            job.state["losses"].append(loss.item())
            if accum > 1:
                (loss / accum).backward()
                if a.idiom == "accum-fetch" and len(job.state["losses"]) == a.migrate_at:
                    job.controller.send("migrate", path=a.checkpoint)
                if (i + 1) % accum:
                    continue
                opt.step()
                opt.zero_grad()
                job.state["step"] += 1
                if a.idiom == "accum":
                    if job.state["step"] == a.migrate_at:
                        job.controller.send("migrate", path=a.checkpoint)
                    job.boundary()
                continue
            if scaler is not None:
                before = scaler.get_scale()
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
                job.state["skipped"] += scaler.get_scale() < before
            else:
                loss.backward()
                if a.idiom == "bf16-clip":
                    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
                opt.step()
            opt.zero_grad()
            if swa is not None and job.state["step"] >= 18:
                swa.update_parameters(model)
                swa_sched.step()
            elif sched is not None and a.idiom != "plateau":
                sched.step()
            if ema is not None:
                with torch.no_grad():
                    for k, v in model.state_dict().items():
                        if a.idiom == "ema-list-stray":
                            continue
                        if a.idiom == "ema-rebound":
                            ema[k] = 0.9 * ema[k] + 0.1 * v
                        else:
                            ema[k].lerp_(v, 0.1)
                    if a.idiom == "ema-list-stray":
                        torch._foreach_lerp_(ema_list, list(model.parameters()), 0.1)
            job.state["step"] += 1
            if job.state["step"] == a.migrate_at:
                job.controller.send("migrate", path=a.checkpoint)
        if a.idiom == "best-state" and sum(job.state["losses"][-12:]) < best["loss"]:
            best["loss"] = sum(job.state["losses"][-12:])
            best["weights"] = {k: v.clone() for k, v in model.state_dict().items()}
        if a.idiom == "plateau":
            sched.step(sum(job.state["losses"][-len(loader):]) / len(loader))
    if best["weights"] is not None:
        model.load_state_dict(best["weights"])      # (early stopping's end: the best epoch's weights)
    out["model"] = model.state_dict()
    out["losses"] = job.state["losses"]
    if swa is not None:
        out["swa"] = swa.state_dict()
    if a.idiom.endswith("-stat"):
        out["stat"] = model.stat
    out["lr"] = [g["lr"] for g in opt.param_groups]
    if ema is not None:
        out["ema"] = dict(ema)
        out["ema_list"] = ema_list
    if scaler is not None:
        out["scale"] = scaler.get_scale()
        out["skipped"] = job.state["skipped"]
    torch.save(out, a.out)
    print(f"steps {job.state['step']}; {out.get('skipped', 0)} skipped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
