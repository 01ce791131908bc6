"""Polynomial regression with hand-written updates (no torch.optim), in the style of PyTorch's regression
example: the loop the module hook gives boundaries to.
Usage: poly_regression.py OUT.pt [STEPS [SLEEP [UNPACED_WHEN]]]
(SLEEP: seconds each step also waits, standing for a GPU's compute, until the file UNPACED_WHEN exists)"""
import sys

import torch
from torch import nn
from pacing import pause  # (tests/scripts, this script's directory)

torch.manual_seed(3)
torch.set_num_threads(1)
DEGREE, LR = 4, 0.05
true_w, true_b = torch.randn(DEGREE, 1) * 0.5, torch.randn(1) * 0.5


def features(x):
    return torch.cat([x ** i for i in range(1, DEGREE + 1)], 1)


fc = nn.Linear(DEGREE, 1)
STEPS = int(sys.argv[2]) if len(sys.argv) > 2 else 60
SLEEP = float(sys.argv[3]) if len(sys.argv) > 3 else 0.0
UNPACED_WHEN = sys.argv[4] if len(sys.argv) > 4 else None
for step in range(STEPS):
    pause(SLEEP, UNPACED_WHEN)
    x = torch.randn(32, 1)
    y = features(x) @ true_w + true_b
    loss = nn.functional.smooth_l1_loss(fc(features(x)), y)
    loss.backward()
    for p in fc.parameters():
        p.data.add_(-LR * p.grad)
        p.grad.zero_()
torch.save(fc.state_dict(), sys.argv[1])
print(f"final loss {loss.item():.6f}")
