"""A job that trains a few steps, then asks for more memory than its limit (tests/node/test_e2e_memlimit.py).

usage: memhog_job.py OUT STEPS GRAB_MIB
Trains STEPS plain torch steps (boundaries through gmux-launch's optimizer hook), then allocates GRAB_MIB MiB.
A refusal is caught as a user would (`except torch.OutOfMemoryError`), written to OUT with the job's last
loss, and raised again, so that the job ends failed with the error as its reason. Without a limit the
allocation succeeds and OUT says so.
"""
import json
import sys

import torch

out, steps, grab = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(steps):
    x = torch.randn(32, 32, generator=torch.Generator().manual_seed(step))
    loss = torch.nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True))
    opt.zero_grad()
    loss.backward()
    opt.step()
try:
    hog = torch.ones(grab << 20, dtype=torch.uint8)
except torch.OutOfMemoryError as e:
    with open(out, "w") as f:
        json.dump({"refused": str(e), "type": type(e).__name__, "loss": float(loss)}, f)
    raise
with open(out, "w") as f:
    json.dump({"refused": None, "allocated": int(hog.sum())}, f)
