"""Training whose tensors are not all the job's own dense memory. `shared`: a model in shared memory
(`model.share_memory()`) trained in this process; `hogwild`: the same model trained in a forked child, as
PyTorch's Hogwild example does, the parent saving what the child wrote; `sparse`: embeddings with sparse
gradients under SparseAdam beside a dense head under Adam, with one slow step so that the job reports its
memory (once a second) while sparse gradients exist. Usage: shared_and_sparse.py OUT.pt MODE"""
import sys
import time

import torch
import torch.multiprocessing as mp
from torch import nn
from torch.nn import functional as F

STEPS = 60


def train(model, steps, record):
    torch.manual_seed(1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.5)
    w = torch.randn(16, 4)
    for _ in range(steps):
        x = torch.randn(32, 16)
        loss = F.cross_entropy(model(x), (x @ w).argmax(1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    torch.save(opt.state_dict(), record)


def dense(mode, out):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))
    model.share_memory()
    if mode == "shared":
        train(model, STEPS, out + ".opt")
    else:
        child = mp.get_context("fork").Process(target=train, args=(model, STEPS, out + ".opt"))
        child.start()
        child.join()
        assert child.exitcode == 0, f"the Hogwild child exited {child.exitcode}"
    torch.save({"model": model.state_dict(), "opt": torch.load(out + ".opt")}, out)


def sparse(out):
    torch.manual_seed(0)
    users, items, head = nn.Embedding(50, 8, sparse=True), nn.Embedding(40, 8, sparse=True), nn.Linear(16, 1)
    opt_sparse = torch.optim.SparseAdam(list(users.parameters()) + list(items.parameters()), lr=1e-2)
    opt_dense = torch.optim.Adam(head.parameters(), lr=1e-3)
    for step in range(STEPS):
        if step == STEPS // 2:
            time.sleep(1.2)
        u, i = torch.randint(0, 50, (32,)), torch.randint(0, 40, (32,))
        loss = F.mse_loss(head(torch.cat([users(u), items(i)], 1)).squeeze(1), ((u % 7) + (i % 5)).float() / 10)
        opt_sparse.zero_grad()
        opt_dense.zero_grad()
        loss.backward()
        opt_sparse.step()
        opt_dense.step()
    torch.save({"users": users.state_dict(), "items": items.state_dict(), "head": head.state_dict(),
                "sparse": opt_sparse.state_dict(), "dense": opt_dense.state_dict()}, out)


if __name__ == "__main__":
    out, mode = sys.argv[1], sys.argv[2]
    sparse(out) if mode == "sparse" else dense(mode, out)
