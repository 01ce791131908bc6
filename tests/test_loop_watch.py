"""Where the transparent hook finds boundaries (gmux/job/boundaries.py), loop by loop, in this process: each
test drives a small real training loop and records what LoopWatch marks and what was in flight at that moment."""
import pytest
import torch
from torch import nn
from torch.nn.modules import module as module_hooks

from gmux.job.boundaries import LEARN_STEPS, MODULE, OPTIMIZER, SCOUT_BOUNDARIES, LoopWatch


class Recorder:
    def __init__(self):
        self.marks = []
        self.inside_backward = 0     # boundaries marked while a backward ran on this thread
        self.watch = LoopWatch(self.mark, lambda o: None, lambda m: None)

    def mark(self, source):
        # what a suspend at this boundary would meet: a step in progress, a graph waiting for its backward
        self.marks.append((source, self.watch._in_step, self.watch._graph_waiting()))
        self.inside_backward += torch._C._current_graph_task_id() != -1

    def sources(self):
        return {s for s, _, _ in self.marks}


@pytest.fixture
def rec():
    torch.manual_seed(0)
    r = Recorder()
    yield r
    r.watch.close()


def test_hand_written_updates_get_a_boundary_per_iteration_at_the_model_call(rec):
    fc = nn.Linear(3, 1)
    for _ in range(10):
        fc(torch.randn(4, 3)).pow(2).mean().backward()
        for p in fc.parameters():
            p.data.add_(-0.1 * p.grad)
            p.grad.zero_()
    assert len(rec.marks) == 9 and rec.sources() == {MODULE}   # the first call has no update before it


def test_hand_written_accumulation_has_no_boundary_between_micro_batches(rec):
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1))
    calls = 0
    for update in range(6):
        for micro in range(3):
            calls += 1
            model(torch.randn(4, 3)).sum().backward()
            if micro == 0:
                assert len(rec.marks) == update, "a boundary between micro-batches"
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.01 * p.grad
                p.grad = None
    assert len(rec.marks) == 5 and rec.sources() == {MODULE}


def test_grads_cleared_only_through_dot_data_give_no_boundary(rec):
    fc = nn.Linear(3, 1)
    for _ in range(5):
        fc(torch.randn(4, 3)).sum().backward()
        for p in fc.parameters():
            p.data.add_(-0.1 * p.grad)
            p.grad.data.zero_()     # invisible to the version counter: documented as a loop without boundaries
    assert rec.marks == []


def test_pure_tensor_code_gets_no_boundary(rec):
    w = torch.randn(3, 1, requires_grad=True)
    for _ in range(5):
        (torch.randn(4, 3) @ w).sum().backward()
        with torch.no_grad():
            w -= 0.1 * w.grad
            w.grad = None
    assert rec.marks == []


def test_optimizer_steps_with_accumulation_are_the_only_boundaries(rec):
    model = nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(5):
        for _ in range(4):
            model(torch.randn(2, 3)).sum().backward()
        opt.step()
        opt.zero_grad()
    assert len(rec.marks) == 5 and rec.sources() == {OPTIMIZER}


def test_lbfgs_closure_calls_never_get_a_boundary(rec):
    model = nn.Linear(3, 1)
    x, y = torch.randn(16, 3), torch.randn(16, 1)
    opt = torch.optim.LBFGS(model.parameters(), max_iter=5)
    calls = []

    def closure():
        calls.append(len(rec.marks))
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        return loss
    for _ in range(4):
        opt.step(closure)
    assert len(calls) > 8 and len(rec.marks) == 4
    assert all(in_step == 0 for _, in_step, _ in rec.marks)


def _gan(critic_steps: int, reuse_fake: bool, iterations: int):
    G, D = nn.Linear(2, 2), nn.Linear(2, 1)
    og, od = torch.optim.Adam(G.parameters()), torch.optim.Adam(D.parameters())
    for _ in range(iterations):
        fake = G(torch.randn(4, 2))
        for _ in range(critic_steps):
            od.zero_grad()
            (D(torch.randn(4, 2)) - D(fake.detach())).mean().backward()
            od.step()
        og.zero_grad()
        D(fake if reuse_fake else G(torch.randn(4, 2))).mean().backward()
        og.step()


@pytest.mark.parametrize("critic_steps,reuse_fake", [(1, True), (1, False), (5, False)])
def test_a_loop_over_two_models_gets_one_boundary_per_iteration(rec, critic_steps, reuse_fake):
    _gan(critic_steps, reuse_fake, 30)
    # Until the generator first steps, each critic step is a boundary (one optimizer is all there is); the next
    # iterations teach the order of the steps; from then on, one per iteration.
    assert 26 <= len(rec.marks) <= 29 + critic_steps, rec.marks
    assert all(not waiting for _, _, waiting in rec.marks), "a boundary cut through the generator's graph"


@pytest.mark.parametrize("critic_steps", [1, 3])
def test_a_gan_loops_boundaries_count_its_iterations_once_its_round_is_known(rec, critic_steps):
    """STEP is the boundaries counted: in a loop stepping two optimizers it ended one short of the loop's
    iterations (299 of 300), because the iteration that taught the order of the steps was never marked. Until
    the generator first steps, a critic step with no graph waiting is a boundary of its own."""
    _gan(critic_steps, False, 300)
    assert 300 <= len(rec.marks) <= 300 + critic_steps - 1 and rec.sources() == {OPTIMIZER}, len(rec.marks)


def test_an_optimizer_that_stops_stepping_while_the_round_is_learnt_does_not_end_the_boundaries(rec):
    """A warm-up head's optimizer steps in the first iteration only: the round, learnt from it as the newcomer,
    never ended, and the loop had no boundary again."""
    body, head = nn.Linear(3, 3), nn.Linear(3, 1)
    ob, oh = torch.optim.SGD(body.parameters(), lr=0.01), torch.optim.SGD(head.parameters(), lr=0.01)
    for i in range(LEARN_STEPS + 100):
        ob.zero_grad(), oh.zero_grad()
        head(body(torch.randn(4, 3))).pow(2).mean().backward()
        ob.step()
        if i == 0:
            oh.step()
    late = len(rec.marks)
    for _ in range(50):
        ob.zero_grad()
        head(body(torch.randn(4, 3))).pow(2).mean().backward()
        ob.step()
    assert len(rec.marks) - late == 50, (late, len(rec.marks))


def test_the_global_module_hooks_go_once_the_loop_is_known(rec):
    hook = rec.watch._scout_pre
    fc = nn.Linear(3, 1)
    for _ in range(SCOUT_BOUNDARIES + 5):
        fc(torch.randn(4, 3)).sum().backward()
        for p in fc.parameters():
            p.data.add_(-0.1 * p.grad)
            p.grad = None
    assert hook not in module_hooks._global_forward_pre_hooks.values()
    assert len(rec.marks) == SCOUT_BOUNDARIES + 4          # the model's own hook carries on


def _steps_in_backward(model, lr=0.05):
    """One optimizer per parameter, stepped from its post-accumulate-grad hook (PyTorch's recipe)."""
    opts = {p: torch.optim.SGD([p], lr=lr) for p in model.parameters()}

    def step(p):
        opts[p].step()
        opts[p].zero_grad()
    for p in model.parameters():
        p.register_post_accumulate_grad_hook(step)


@pytest.mark.parametrize("checkpointed", [False, True])
def test_optimizers_stepped_inside_the_backward_get_their_boundary_after_it(rec, checkpointed):
    """Their steps come while the backward still runs; the boundary waits for the next iteration's call. With
    activation checkpointing the recomputed forward inside the backward is not a call of the loop (it once
    took a boundary there and, stopped early by torch, left the hook's depth up: no boundary ever again)."""
    from torch.utils.checkpoint import checkpoint
    blocks = nn.ModuleList([nn.Sequential(nn.Linear(4, 4), nn.Tanh()) for _ in range(3)])

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = blocks

        def forward(self, x):
            for b in self.blocks:
                x = checkpoint(b, x, use_reentrant=False) if checkpointed else b(x)
            return x
    model = Net()
    _steps_in_backward(model)
    for _ in range(10):
        model(torch.randn(5, 4)).pow(2).mean().backward()
    assert len(rec.marks) == 9 and rec.sources() == {OPTIMIZER} and rec.inside_backward == 0, rec.marks


def test_a_gradient_penalty_is_not_the_iterations_backward(rec):
    """WGAN-GP: torch.autograd.grad of the critic, with create_graph, before any optimizer has stepped. Taken for
    the iteration's backward, it let a boundary fall at the next critic call, while the penalty's graph waited."""
    critic = nn.Sequential(nn.Linear(4, 8), nn.LeakyReLU(0.2), nn.Linear(8, 1))
    opt = torch.optim.Adam(critic.parameters(), lr=1e-3)
    for _ in range(4):
        real, fake = torch.randn(6, 4), torch.randn(6, 4)
        mixed = (0.5 * real + 0.5 * fake).requires_grad_(True)
        g = torch.autograd.grad(critic(mixed).sum(), mixed, create_graph=True)[0]
        loss = critic(fake).mean() - critic(real).mean() + ((g.norm(2, dim=1) - 1) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert len(rec.marks) == 4 and rec.sources() == {OPTIMIZER}, rec.marks


@pytest.mark.parametrize("where", ["after", "in hooks"])
def test_hand_updates_from_torch_autograd_grad_get_a_boundary_per_iteration(rec, where):
    """Functional or meta-learning style: the gradients come from torch.autograd.grad (no .grad is set) or are
    applied and cleared in the backward's own hooks; the update by hand is what says the backward was the
    iteration's."""
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1))
    params = list(model.parameters())
    if where == "in hooks":
        def apply(p):
            with torch.no_grad():
                p -= 0.1 * p.grad
            p.grad = None
        for p in params:
            p.register_post_accumulate_grad_hook(apply)
    for _ in range(10):
        loss = model(torch.randn(5, 3)).pow(2).mean()
        if where == "in hooks":
            loss.backward()
        else:
            grads = torch.autograd.grad(loss, params)
            with torch.no_grad():
                for p, g in zip(params, grads):
                    p -= 0.1 * g
    assert len(rec.marks) == 9 and rec.sources() == {MODULE} and rec.inside_backward == 0, rec.marks
