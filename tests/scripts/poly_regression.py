"""Polynomial regression with hand-written updates (no torch.optim), in the style of PyTorch's regression
example: the loop the module hook gives boundaries to. Usage: poly_regression.py OUT.pt [STEPS [SLEEP]]
(SLEEP: seconds each step also waits, standing for a GPU's compute)"""
import sys
import time

import torch
from torch import nn

torch.manual_seed(3)
torch.set_num_threads(1)
DEGREE, LR = 4, 0.05
true_w, true_b = torch.randn(DEGREE, 1) * 0.5, torch.randn(1) * 0.5


def features(x):
    return torch.cat([x ** i for i in range(1, DEGREE + 1)], 1)


fc = nn.Linear(DEGREE, 1)
STEPS = int(sys.argv[2]) if len(sys.argv) > 2 else 60
SLEEP = float(sys.argv[3]) if len(sys.argv) > 3 else 0.0
for step in range(STEPS):
    time.sleep(SLEEP)
    x = torch.randn(32, 1)
    y = features(x) @ true_w + true_b
    loss = nn.functional.smooth_l1_loss(fc(features(x)), y)
    loss.backward()
    for p in fc.parameters():
        p.data.add_(-LR * p.grad)
        p.grad.zero_()
torch.save(fc.state_dict(), sys.argv[1])
print(f"final loss {loss.item():.6f}")
