"""Plain-PyTorch training idioms around an attached job (explicit mode), one chosen by flag, moved into a new process
at a step or not; what the run ends with is saved for a bit-for-bit comparison (tests/test_idioms.py).

usage: idioms.py OUT IDIOM [--migrate-at STEP --checkpoint PATH] [--restore PATH]

IDIOM:
  scaler-attached, scaler-stray: a GradScaler (on the CPU) whose scale starts too high, so that its first steps are
      skipped, and grows every 3 steps; attached, or not;
  ema-rebound: an EMA of the weights kept as a dict of tensors passed in extras=, its entries made anew each step
      (ema[k] = d * ema[k] + (1 - d) * p), not updated in place;
  ema-inplace: the same, updated in place (lerp_).
"""
import argparse
import sys

import torch

import gmux.job


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
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    x = torch.randn(96, 8)
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
        extras = ema
    job = gmux.job.attach(*objects, extras=extras, state={"step": 0, "skipped": 0})
    if a.restore:
        job.restore(a.restore)
    for _ in job.epochs(3):
        for xb, yb in job.data(loader):
            loss = torch.nn.functional.mse_loss(model(xb), yb)
            if scaler is not None:
                before = scaler.get_scale()
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
                job.state["skipped"] += scaler.get_scale() < before
            else:
                loss.backward()
                opt.step()
            opt.zero_grad()
            if ema is not None:
                with torch.no_grad():
                    for k, v in model.state_dict().items():
                        if a.idiom == "ema-rebound":
                            ema[k] = 0.9 * ema[k] + 0.1 * v
                        else:
                            ema[k].lerp_(v, 0.1)
            job.state["step"] += 1
            if job.state["step"] == a.migrate_at:
                job.controller.send("migrate", path=a.checkpoint)
    out["model"] = model.state_dict()
    if ema is not None:
        out["ema"] = dict(ema)
    if scaler is not None:
        out["scale"] = scaler.get_scale()
        out["skipped"] = job.state["skipped"]
    torch.save(out, a.out)
    print(f"steps {job.state['step']}; {out.get('skipped', 0)} skipped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
