"""A sine-wave predictor (LSTM) trained with torch.optim.LBFGS and a closure, in the style of PyTorch's
time-sequence example: LBFGS calls the closure several times per step, and no boundary may fall inside a step.
Under gmux it counts the boundaries it sees from inside the closure.
Usage: lbfgs_timeseries.py OUT.pt [STEPS [SLEEP [UNPACED_WHEN]]] (SLEEP: seconds each closure call also waits,
standing for a GPU's compute, until the file UNPACED_WHEN exists)"""
import sys

import torch
from torch import nn
from pacing import pause  # (tests/scripts, this script's directory)

torch.manual_seed(5)
torch.set_num_threads(1)


class Sequence(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(1, 12, batch_first=True)
        self.head = nn.Linear(12, 1)

    def forward(self, x):
        out, _ = self.lstm(x)
        return self.head(out)


t = torch.arange(0, 41, dtype=torch.float32)
phase = torch.randint(-20, 20, (16, 1)).float()
wave = torch.sin((t + phase) / 4.0).unsqueeze(-1)
inputs, targets = wave[:, :-1], wave[:, 1:]
model = Sequence()
opt = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=6, history_size=8)


def boundaries_seen():
    api = sys.modules.get("gmux.job.api")    # present only under gmux
    job = api.current() if api is not None else None
    return job.profile.steps if job is not None else 0


inside = 0
STEPS = int(sys.argv[2]) if len(sys.argv) > 2 else 8
SLEEP = float(sys.argv[3]) if len(sys.argv) > 3 else 0.0
UNPACED_WHEN = sys.argv[4] if len(sys.argv) > 4 else None
for step in range(STEPS):
    before = boundaries_seen()

    def closure():
        global inside
        inside += boundaries_seen() != before
        pause(SLEEP, UNPACED_WHEN)
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(inputs), targets)
        loss.backward()
        return loss
    loss = opt.step(closure)
torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, sys.argv[1])
print(f"final loss {loss.item():.6f}; closure calls that saw a boundary inside a step: {inside}")
