"""Training loops as people write them that once lost exactness under the transparent hook:

usage: hook_patterns.py MODE OUT, MODE one of
  accumulator-hooks    hooks on each parameter's gradient accumulator (as DDP's all-reduce and Horovod hook in)
  optimizer-in-backward  one optimizer per parameter, stepped from its post-accumulate-grad hook (PyTorch's recipe)
  gradient-penalty     WGAN-GP: torch.autograd.grad with create_graph=True before the critic's backward
  flat-buffer          the model's parameters and gradients views of one flat parameter outside any module, the
                       only one its optimizer steps (apex's and Megatron's contiguous buffers)
  torchscript          a torch.jit.script model (it takes no module hooks of its own)
  sparse-csr           a graph network whose adjacency is a sparse CSR buffer
  inference-buffer     a buffer computed under torch.inference_mode() before training
  tutorial-by-hand     PyTorch's tutorial loop: updated by hand, gradients cleared between forward and backward
  k-fold               a new model and optimizer per fold, the earlier ones dropped (writes how many live on)
  optimizer-per-epoch  an optimizer with momentum made again each epoch (writes the epochs gmux did not track it)
  accumulate-max-norm  updated by hand after 4 accumulated micro-batches, each after a no_grad call of the model
                       for its targets, the model an Embedding with max_norm (renormalised in its forward)
  inference-teacher    distillation from a teacher built under torch.inference_mode, first called after a step
Writes OUT: torch.save of every model's and optimizer's state, and how many times the hooks ran.
"""
import sys

import torch
from torch import nn

mode, out = sys.argv[1], sys.argv[2]
torch.manual_seed(0)
torch.use_deterministic_algorithms(True)
torch.set_num_threads(1)
X, Y = torch.randn(30, 8, 8), torch.randn(30, 8, 1)
fired = []


def fit(model, opt, steps=30):
    for i in range(steps):
        opt.zero_grad()
        ((model(X[i]) - Y[i]) ** 2).mean().backward()
        opt.step()


if mode == "accumulator-hooks":
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    accumulators = []
    for p in model.parameters():
        acc = p.view_as(p).grad_fn.next_functions[0][0]

        def scale(*_, p=p):
            fired.append(1)
            p.grad.mul_(0.5)
        acc.register_hook(scale)
        accumulators.append(acc)
    fit(model, opt)
    state = {"model": model.state_dict(), "opt": opt.state_dict()}
elif mode == "optimizer-in-backward":
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 1))
    opts = {p: torch.optim.Adam([p], foreach=False) for p in model.parameters()}

    def step(p):
        fired.append(1)
        opts[p].step()
        opts[p].zero_grad()
    for p in model.parameters():
        p.register_post_accumulate_grad_hook(step)
    for i in range(30):
        ((model(X[i]) - Y[i]) ** 2).mean().backward()
    state = {"model": model.state_dict(), "opts": [o.state_dict() for o in opts.values()]}
elif mode == "gradient-penalty":
    G = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 8))
    D = nn.Sequential(nn.Linear(8, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1))
    oG = torch.optim.Adam(G.parameters(), lr=1e-3, betas=(0.5, 0.9))
    oD = torch.optim.Adam(D.parameters(), lr=1e-3, betas=(0.5, 0.9))
    real = torch.randn(40, 16, 8) + 2
    for it in range(10):
        for k in range(3):
            r, f = real[it * 3 + k], G(torch.randn(16, 4)).detach()
            a = torch.rand(16, 1)
            xh = (a * r + (1 - a) * f).requires_grad_(True)
            g = torch.autograd.grad(D(xh).sum(), xh, create_graph=True)[0]
            loss = D(f).mean() - D(r).mean() + 10 * ((g.norm(2, dim=1) - 1) ** 2).mean()
            oD.zero_grad()
            loss.backward()
            oD.step()
        oG.zero_grad()
        (-D(G(torch.randn(16, 4))).mean()).backward()
        oG.step()
    state = {"G": G.state_dict(), "D": D.state_dict(), "oG": oG.state_dict(), "oD": oD.state_dict()}
elif mode == "flat-buffer":
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
    params = list(model.parameters())
    flat = nn.Parameter(torch.cat([p.detach().reshape(-1) for p in params]))
    flat.grad = torch.zeros_like(flat)
    at = 0
    for p in params:
        p.data = flat.data[at:at + p.numel()].view_as(p)
        p.grad = flat.grad[at:at + p.numel()].view_as(p)
        at += p.numel()
    opt = torch.optim.SGD([flat], lr=0.05, momentum=0.9)
    for i in range(30):
        opt.zero_grad(set_to_none=False)
        ((model(X[i]) - Y[i]) ** 2).mean().backward()
        opt.step()
    state = {"model": model.state_dict(), "opt": opt.state_dict()}
elif mode == "torchscript":
    model = torch.jit.script(nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    fit(model, opt)
    state = {"model": model.state_dict(), "opt": opt.state_dict()}
elif mode == "sparse-csr":
    class Graph(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("adjacency", (torch.rand(8, 8) < 0.3).float().to_sparse_csr())
            self.lin = nn.Linear(8, 1)

        def forward(self, x):
            return self.lin(self.adjacency @ x)
    model = Graph()
    opt = torch.optim.Adam(model.lin.parameters(), lr=1e-2)
    fit(model, opt)
    state = {"lin": model.lin.state_dict(), "adjacency": model.adjacency.to_dense(), "opt": opt.state_dict()}
elif mode == "inference-buffer":
    class Centred(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("centre", torch.zeros(8))
            self.lin = nn.Linear(8, 1)

        def forward(self, x):
            return self.lin(x - self.centre)
    model = Centred()
    with torch.inference_mode():
        model.centre = X.reshape(-1, 8).mean(0)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    fit(model, opt)
    state = {"model": model.state_dict(), "opt": opt.state_dict()}
elif mode == "tutorial-by-hand":
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    for i in range(30):
        loss = ((model(X[i]) - Y[i]) ** 2).sum()
        model.zero_grad()
        loss.backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= 1e-3 * p.grad
    state = {"model": model.state_dict()}
elif mode == "k-fold":
    import gc
    import weakref
    dropped = []
    for fold in range(3):
        model = nn.Sequential(nn.Linear(8, 256), nn.ReLU(), nn.Linear(256, 1))
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        fit(model, opt, 10)
        if fold < 2:
            dropped += [weakref.ref(model), weakref.ref(opt)]
            del model, opt
            gc.collect()
    state = {"model": model.state_dict(), "opt": opt.state_dict(), "alive": sum(r() is not None for r in dropped)}
elif mode == "optimizer-per-epoch":
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
    untracked = []
    for epoch in range(10):
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        fit(model, opt, 3)
        job = sys.modules.get("gmux.job.api") and sys.modules["gmux.job.api"].current()
        if job is not None and not any(o is opt for o in job.tracked.optimizers):
            untracked.append(epoch)
    state = {"model": model.state_dict(), "untracked": untracked}
elif mode == "accumulate-max-norm":
    model = nn.Sequential(nn.Embedding(50, 8, max_norm=1.0), nn.Flatten(), nn.Linear(32, 4))
    tokens = torch.randint(0, 50, (40, 6, 4))
    for step in range(10):
        for micro in range(4):
            with torch.no_grad():
                target = model(tokens[step * 4 + micro]).softmax(-1)
            logits = model(tokens[step * 4 + micro])
            (-(target * logits.log_softmax(-1)).sum() / 4).backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.1 * p.grad
        model.zero_grad()
    state = {"model": model.state_dict()}
elif mode == "inference-teacher":
    with torch.inference_mode():
        teacher = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
    model = nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for i in range(30):
        with torch.inference_mode():
            target = teacher(X[i]) if i else Y[i]
        opt.zero_grad()
        ((model(X[i]) - target.clone()) ** 2).mean().backward()
        opt.step()
    state = {"model": model.state_dict(), "teacher": {k: v.clone() for k, v in teacher.state_dict().items()}}
else:
    sys.exit(f"unknown mode {mode!r}")
torch.save({**state, "fired": len(fired)}, out)
