"""A tensor in state= reset at the epoch's top (a running loss kept as a tensor to avoid .item() syncs, as HF's
Trainer keeps tr_loss; an RNN's hidden state carried across batches, as in truncated BPTT). README: "within
job.epochs the top sees state= as it was at the epoch's start, and the body the checkpoint's values, so ... a sum
reset there [is] exact". A sum kept as a float is; one kept as a tensor is not: after a move the body keeps the
top's fresh zero.

usage: state_tensor_top.py OUT [--migrate-at STEP --checkpoint PATH] [--restore PATH]"""
import argparse
import torch
from torch import nn
import torch.nn.functional as F
import gmux.job

p = argparse.ArgumentParser()
p.add_argument("out"); p.add_argument("--migrate-at", type=int); p.add_argument("--checkpoint"); p.add_argument("--restore")
a = p.parse_args()
torch.manual_seed(0)
model = nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
X = torch.randn(32, 4)
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, X.sum(1, keepdim=True)), batch_size=4)
job = gmux.job.attach(model, opt, state={"step": 0, "running": None, "running_f": 0.0, "epoch_loss": []})
if a.restore:
    job.restore(a.restore)
for epoch in job.epochs(2):
    job.state["running"] = torch.zeros(())       # a tensor sum, reset at the epoch's top
    job.state["running_f"] = 0.0                 # the same as a float
    for x, y in job.data(loader):
        loss = F.mse_loss(model(x), y)
        opt.zero_grad(); loss.backward(); opt.step()
        job.state["running"] = job.state["running"] + loss.detach()
        job.state["running_f"] += loss.item()
        job.state["step"] += 1
        if job.state["step"] == a.migrate_at:
            job.controller.send("migrate", path=a.checkpoint)
    job.state["epoch_loss"].append((float(job.state["running"]), job.state["running_f"]))
print(job.state["epoch_loss"])
torch.save({"epoch_loss": torch.tensor(job.state["epoch_loss"]), "model": model.state_dict()}, a.out)
