"""An auxiliary loader read beside the epoch's (multi-task), its iterator made through job.data once and made again
only when it ends, so a pass over it goes on across an epoch's end; moved into a new process while that pass is under
way in the later epoch.
usage: aux_across_epochs.py OUT [--migrate-at K --checkpoint P] [--restore P]"""
import argparse
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
import gmux.job

p = argparse.ArgumentParser()
p.add_argument("out"); p.add_argument("--migrate-at", type=int); p.add_argument("--checkpoint")
p.add_argument("--restore")
a = p.parse_args()
torch.manual_seed(0)
X = torch.randn(40, 8)
main = DataLoader(TensorDataset(X, X.sum(1, keepdim=True)), batch_size=4)          # 10 batches an epoch
aux = DataLoader(TensorDataset(X[:28], -X[:28].sum(1, keepdim=True)), batch_size=4)  # 7 batches a pass
model = nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.02)
job = gmux.job.attach(model, opt, state={"step": 0})
if a.restore:
    job.restore(a.restore)
aux_it = iter(job.data(aux))
for epoch in job.epochs(2):
    for x, y in job.data(main):
        try:
            ax, ay = next(aux_it)
        except StopIteration:
            aux_it = iter(job.data(aux)); ax, ay = next(aux_it)
        opt.zero_grad()
        (nn.functional.mse_loss(model(x), y) + nn.functional.mse_loss(model(ax), ay)).backward(); opt.step()
        job.state["step"] += 1
        if job.state["step"] == a.migrate_at:
            job.controller.send("migrate", path=a.checkpoint)
torch.save(model.state_dict(), a.out)
