"""Embeddings with sparse gradients (Embedding(sparse=True)) beside a dense head, optimizer.zero_grad() at the top
of each step as most loops have it, so the last step's sparse gradients are still there at every boundary. Moved
into a new process mid-run, it must end with the weights, gradients and optimizer state of an uninterrupted run
(tests/test_bit_identical.py).

usage: sparse_embeddings.py OUT MODE [--migrate-at STEP --checkpoint PATH] [--restore PATH]

MODE: sgd (one SGD with momentum over all: its momentum buffers of the embeddings are sparse too), sgd-plain (no
momentum) or sparseadam (SparseAdam for the embeddings, Adam for the head).
"""
import argparse
import sys

import torch
from torch import nn
from torch.nn import functional as F

import gmux.job

STEPS = 24


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("mode", choices=["sgd", "sgd-plain", "sparseadam"])
    p.add_argument("--migrate-at", type=int)
    p.add_argument("--checkpoint")
    p.add_argument("--restore")
    a = p.parse_args()
    torch.manual_seed(0)
    users, items, head = nn.Embedding(50, 8, sparse=True), nn.Embedding(40, 8, sparse=True), nn.Linear(16, 1)
    embeddings = [*users.parameters(), *items.parameters()]
    if a.mode == "sparseadam":
        optimizers = [torch.optim.SparseAdam(embeddings, lr=1e-2), torch.optim.Adam(head.parameters(), lr=1e-3)]
    else:
        optimizers = [torch.optim.SGD([*embeddings, *head.parameters()], lr=0.05,
                                      momentum=0.9 if a.mode == "sgd" else 0.0)]
    job = gmux.job.attach(users, items, head, *optimizers, state={"step": 0})
    if a.restore:
        job.restore(a.restore)
    while job.state["step"] < STEPS:
        for opt in optimizers:
            opt.zero_grad()
        u, i = torch.randint(0, 50, (32,)), torch.randint(0, 40, (32,))
        loss = F.mse_loss(head(torch.cat([users(u), items(i)], 1)).squeeze(1), ((u % 7) + (i % 5)).float() / 10)
        loss.backward()
        for opt in optimizers:
            opt.step()
        job.state["step"] += 1
        if job.state["step"] == a.migrate_at:
            job.controller.send("migrate", path=a.checkpoint)
        job.boundary()
    modules = {"users": users, "items": items, "head": head}
    torch.save({"modules": {k: m.state_dict() for k, m in modules.items()},
                "grads": {f"{k}.{n}": p.grad for k, m in modules.items() for n, p in m.named_parameters()},
                "optimizers": [opt.state_dict() for opt in optimizers]}, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
