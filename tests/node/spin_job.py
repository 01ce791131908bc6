"""A job with no mini-batch boundary at all: under gmux-launch it registers, imports torch (the launcher does),
and then runs for ever with no optimizer step and no module call gmux could hook. gmuxd can never suspend it; it
can only take the GPU's compute away from it, by SIGSTOP (tests/node/test_e2e_stalling.py). Its loop waits, as
a process whose kernels keep its GPU busy does: gmuxd tells running from stopped by the process's state, where
sleeping counts as running, and a loop that spun in Python took a core of a shared 2-core machine whenever gmuxd
let it run (in one test, for the whole test)."""
import time

import torch

x = torch.zeros(1)   # it touches torch, as a training script would, and then never reaches a boundary
while True:
    time.sleep(0.01)
