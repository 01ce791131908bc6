"""A job with no mini-batch boundary at all: under gmux-launch it registers, imports torch (the launcher does),
and then spins in plain Python for ever, with no optimizer step and no module call gmux could hook. gmuxd can
never suspend it; it can only take the GPU's compute away from it (tests/node/test_e2e_stalling.py)."""
import torch

x = torch.zeros(1)   # it touches torch, as a training script would, and then never reaches a boundary
n = 0
while True:
    n += 1
