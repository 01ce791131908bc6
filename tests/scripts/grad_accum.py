"""Gradient accumulation: 4 micro-batches per update, by torch.optim.SGD (momentum) or by hand (--by-hand).
No boundary may fall between micro-batches whose gradients wait for the update: one per update.
Usage: grad_accum.py OUT.pt [--by-hand]"""
import sys

import torch
from torch import nn

torch.manual_seed(9)
torch.set_num_threads(1)
UPDATES, MICRO, LR = 20, 4, 0.05
model = nn.Sequential(nn.Linear(10, 32), nn.Tanh(), nn.Linear(32, 3))
by_hand = "--by-hand" in sys.argv
opt = None if by_hand else torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
data, labels = torch.randn(512, 10), torch.randint(0, 3, (512,))
for update in range(UPDATES):
    for micro in range(MICRO):
        idx = torch.randint(0, 512, (16,))
        loss = nn.functional.cross_entropy(model(data[idx]), labels[idx]) / MICRO
        loss.backward()
    if by_hand:
        with torch.no_grad():
            for p in model.parameters():
                p -= LR * p.grad
                p.grad = None
    else:
        opt.step()
        opt.zero_grad()
state = {"model": model.state_dict()}
if opt is not None:
    state["opt"] = opt.state_dict()
torch.save(state, sys.argv[1])
print(f"updates {UPDATES}; final loss {loss.item():.6f}")
