"""A GAN-style loop over two models with two optimizers, in the style of PyTorch's DCGAN example: the
generator's output is made once per iteration and used by the discriminator's step and then the generator's,
so a boundary after the discriminator's step would cut through the generator's graph.
Usage: gan_pair.py OUT.pt [ITERATIONS [SLEEP [UNPACED_WHEN]]] (SLEEP: seconds each iteration also waits, standing
for a GPU's compute, until the file UNPACED_WHEN exists)"""
import sys

import torch
from torch import nn
from pacing import pause  # (tests/scripts, this script's directory)

torch.manual_seed(7)
torch.set_num_threads(1)
ITERATIONS = int(sys.argv[2]) if len(sys.argv) > 2 else 40
SLEEP = float(sys.argv[3]) if len(sys.argv) > 3 else 0.0
UNPACED_WHEN = sys.argv[4] if len(sys.argv) > 4 else None
G = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 2))
D = nn.Sequential(nn.Linear(2, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1))
opt_g = torch.optim.Adam(G.parameters(), lr=2e-3, betas=(0.5, 0.999))
opt_d = torch.optim.Adam(D.parameters(), lr=2e-3, betas=(0.5, 0.999))
bce = nn.BCEWithLogitsLoss()
ones, zeros = torch.ones(32, 1), torch.zeros(32, 1)
for it in range(ITERATIONS):
    pause(SLEEP, UNPACED_WHEN)
    real = torch.randn(32, 2) * 0.3 + torch.tensor([1.0, -1.0])
    fake = G(torch.randn(32, 4))
    D.zero_grad()
    loss_d = bce(D(real), ones) + bce(D(fake.detach()), zeros)
    loss_d.backward()
    opt_d.step()
    G.zero_grad()
    loss_g = bce(D(fake), ones)
    loss_g.backward()
    opt_g.step()
torch.save({"G": G.state_dict(), "D": D.state_dict(), "opt_g": opt_g.state_dict(), "opt_d": opt_d.state_dict()},
           sys.argv[1])
print(f"iterations {ITERATIONS}; final losses D {loss_d.item():.6f} G {loss_g.item():.6f}")
