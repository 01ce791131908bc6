"""usage: state_and_grab.py STEPS GRAB_MIB — trains STEPS steps of a model whose state (weights, momentum,
gradients) is 24 MiB, prints a hash of its weights and momentum, then allocates GRAB_MIB MiB (0: nothing).
For tests/test_memory_limit.py: run plain, and under `python -m gmux.job.run --mem ... --cycle-every 2`."""
import hashlib
import sys

import torch

torch.manual_seed(0)
torch.set_num_threads(1)
steps, grab = int(sys.argv[1]), int(sys.argv[2])
model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.Tanh(), torch.nn.Linear(1024, 1024, bias=False))
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
for step in range(steps):
    x = torch.randn(8, 1024, generator=torch.Generator().manual_seed(step))
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
h = hashlib.sha256()
for p in model.parameters():
    h.update(p.detach().numpy().tobytes())
    h.update(opt.state[p]["momentum_buffer"].numpy().tobytes())
print(h.hexdigest(), flush=True)
if grab:
    hog = torch.ones(grab << 20, dtype=torch.uint8)
    print("allocated", int(hog.sum()))
