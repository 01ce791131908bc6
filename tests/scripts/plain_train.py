"""An ordinary training script that knows nothing of gmux (used to test the transparent hook).

usage: plain_train.py OUT [BACKEND] [--compile-step]: with BACKEND, the model is torch.compile()d with that
backend; with --compile-step too, so is the optimizer's step (PyTorch's recipe: torch.compile(fn calling opt.step))."""
import sys

import torch
from torch import nn

torch.manual_seed(1)
torch.use_deterministic_algorithms(True)
torch.set_num_threads(1)
model = nn.Sequential(nn.Linear(20, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Dropout(0.1), nn.Linear(64, 5))
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
step_fn = opt.step
if len(sys.argv) > 2:
    model = torch.compile(model, backend=sys.argv[2])
    if "--compile-step" in sys.argv[3:]:
        step_fn = torch.compile(lambda: opt.step(), backend=sys.argv[2])
sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=50)
data = torch.randn(256, 20)
target = data[:, :5].argmax(1)
for step in range(50):
    idx = torch.randint(0, 256, (32,))
    loss = nn.functional.cross_entropy(model(data[idx]), target[idx])
    opt.zero_grad()
    loss.backward()
    step_fn()
    sched.step()
torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, sys.argv[1])
print(f"final loss {loss.item():.6f}")
