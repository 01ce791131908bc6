"""Plain-PyTorch idioms around an attached job (tests/scripts/idioms.py), moved into a new process: each ends with
the weights of an uninterrupted run, or its move is refused, naming why, and the job runs on to them."""
import os

import pytest
import torch
from torch import nn

import gmux.job as gj
from gmux.job import movability
from gmux.job.state import StateMismatch
from gmux_testkit import assert_identical, run_py

IDIOMS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts", "idioms.py")


def _train(model, opt, steps):
    for _ in range(steps):
        x = torch.randn(8, 8)
        nn.functional.mse_loss(model(x), x.sum(1, keepdim=True)).backward()
        opt.step()
        opt.zero_grad()


def _solo_and_moved(tmp, idiom, at=7):
    """idioms.py IDIOM run alone, and moved into a new process at step `at`: (the solo run's
    output, the first process; the moved run's output is moved.pt)."""
    run_py(IDIOMS, f"{tmp}/solo.pt", idiom)
    first = run_py(IDIOMS, f"{tmp}/first.pt", idiom, "--migrate-at", str(at), "--checkpoint", f"{tmp}/a.ckpt")
    if os.path.exists(f"{tmp}/a.ckpt"):
        run_py(IDIOMS, f"{tmp}/moved.pt", idiom, "--restore", f"{tmp}/a.ckpt")
    return torch.load(f"{tmp}/solo.pt"), first


def test_a_gradscaler_attached_moves_with_its_scale_and_one_not_attached_keeps_the_job_where_it_is(tmp):
    """The scaler starts too high and grows every 3 steps, so it skips steps. Attached, a move carries its scale and
    the moved run skips what the solo run skipped. Not attached, a new process would start it at its initial scale
    again (it skipped 5 steps instead of 4, the weights up to 0.31 apart): the move is refused, and the job ends
    where it is, as if never asked."""
    solo, _ = _solo_and_moved(tmp, "scaler-attached")
    moved = torch.load(f"{tmp}/moved.pt")
    assert solo["skipped"] == moved["skipped"] == 4
    assert_identical(solo, moved, "scaler-attached")

    os.remove(f"{tmp}/a.ckpt")
    solo, first = _solo_and_moved(tmp, "scaler-stray")
    assert ("gmux: move refused, the job runs on here: an AMP GradScaler attach() was not given steps an optimizer "
            "of the job (SGD)") in first.stderr, first.stderr
    assert not os.path.exists(f"{tmp}/a.ckpt")
    assert solo["skipped"] == 4
    assert_identical(solo, torch.load(f"{tmp}/first.pt"), "scaler-stray")


@pytest.mark.parametrize("idiom", ["ema-rebound", "ema-inplace"])
def test_an_ema_in_extras_moves_exactly_whether_its_tensors_are_updated_in_place_or_made_anew(idiom, tmp):
    """ema[k] = 0.9 * ema[k] + 0.1 * p puts a new tensor in the script's dict at each step: a move checkpointed
    the tensors attach() was given, and the moved run's EMA ended up to 0.0083 away from the solo run's."""
    solo, _ = _solo_and_moved(tmp, idiom)
    assert_identical(solo, torch.load(f"{tmp}/moved.pt"), idiom)


def test_extras_changed_in_layout_since_attach_are_refused_a_checkpoint_naming_them(tmp):
    model = nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    extras = {"ema": torch.zeros(3), "count": torch.zeros(())}
    job = gj.attach(model, opt, extras=extras)
    extras["ema"] = extras["ema"] + 1       # followed: the tensor the dict holds now is the one checkpointed
    assert torch.equal(job.snapshot()["extras"]["ema"], torch.ones(3))
    extras["ema"] = torch.zeros(3, dtype=torch.float64)
    with pytest.raises(StateMismatch, match=r"extras\['ema'\] was torch.float32 \[3\] at attach and is "
                                            r"torch.float64 \[3\] now"):
        job.checkpoint(f"{tmp}/a.ckpt")
    extras["ema"] = torch.zeros(3)
    del extras["count"]
    with pytest.raises(StateMismatch, match=r"extras\['count'\] was torch.float32 \[\] at attach and is gone now"):
        job.checkpoint(f"{tmp}/a.ckpt")
    assert not os.path.exists(f"{tmp}/a.ckpt")


@pytest.mark.parametrize("idiom", ["float-stat", "tensor-stat"])
def test_a_running_statistic_the_forward_keeps_in_an_attribute_moves_exactly(idiom, tmp):
    """The model divides its input by a running mean kept in a plain attribute. As a tensor made anew at each call
    it was left to the new process, which started it again, and the moved run's weights ended up 0.10 from the
    solo run's."""
    solo, _ = _solo_and_moved(tmp, idiom)
    moved = torch.load(f"{tmp}/moved.pt")
    assert solo["stat"] != 1.0
    assert_identical(solo, moved, idiom)


@pytest.mark.parametrize("idiom,what", [("ema-stray", "a dict of 4 tensors by the names of the job's module"),
                                        ("ema-list-stray", "a list of 4 tensors shaped like the job's module's")])
def test_an_ema_kept_as_tensors_not_given_to_attach_keeps_the_job_where_it_is(idiom, what, tmp):
    """An EMA of the weights kept as a dict by the model's names, or as a list like its parameters, and not given to
    attach(): a new process built it anew from the model and the moved run's EMA ended up 0.008 from the solo
    run's, its reports saying movable. The move is refused, naming it, and the job ends where it is, as if never
    asked (the same EMA passed in extras= moves: the test above)."""
    solo, first = _solo_and_moved(tmp, idiom)
    assert f"gmux: move refused, the job runs on here: {what}" in first.stderr, first.stderr
    assert not os.path.exists(f"{tmp}/a.ckpt")
    assert_identical(solo, torch.load(f"{tmp}/first.pt"), idiom)


def test_the_reports_say_why_a_job_with_a_scaler_or_an_ema_dict_not_attached_is_not_movable():
    """What gmuxd reads to refuse a move up front (the reports' movable and unmovable), in one process: movable until
    an unattached EMA dict changes between two looks (a move's; the reports' last look is what they say), and until
    an unattached GradScaler steps the job's optimizer."""
    model = nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    job = gj.attach(model, opt)
    assert job.report()["movable"] is True

    def step(scaler=None):
        loss = model(torch.randn(4, 3)).pow(2).mean()
        if scaler is None:
            loss.backward()
            opt.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        opt.zero_grad()

    ema = {k: v.detach().clone() for k, v in model.state_dict().items()}
    assert movability.problem(job, fresh=True) is None        # (a move's look: one seen first is no change)
    step()
    assert movability.problem(job, fresh=True) is None
    for k, v in model.state_dict().items():
        ema[k].lerp_(v, 0.5)
    assert "a dict of 2 tensors by the names of the job's module" in movability.problem(job, fresh=True)
    assert "a dict of 2 tensors" in job.report()["unmovable"]
    del ema
    assert movability.problem(job, fresh=True) is None

    scaler = torch.amp.GradScaler("cpu")
    step(scaler)
    report = job.report()
    assert report["movable"] is False
    assert report["unmovable"].startswith("an AMP GradScaler attach() was not given steps an optimizer of the job "
                                          "(SGD): a new process builds it anew at its initial scale (now 65536)")
    job.tracked.add(scaler)
    assert job.report()["movable"] is True


def test_an_ema_dict_kept_in_state_is_the_jobs_and_leaves_it_movable(tmp):
    """state= is carried by a checkpoint, tensors in its dicts too: an EMA dict kept there was taken for one
    attach() was not given, and its job refused moves it would have made exactly."""
    model = nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ema = {k: v.detach().clone() for k, v in model.state_dict().items()}
    job = gj.attach(model, opt, state={"ema": ema})
    assert movability.problem(job, fresh=True) is None
    for t in ema.values():
        t.add_(1)
    assert movability.problem(job, fresh=True) is None
    job.checkpoint(f"{tmp}/a.ckpt")
    again = {k: v.detach().clone() for k, v in model.state_dict().items()}
    gj.attach(model, opt, state={"ema": again}).restore(f"{tmp}/a.ckpt")
    assert_identical(again, ema, "ema")


def test_a_dict_of_per_parameter_metrics_for_a_log_leaves_the_job_movable():
    """A grad norm by each parameter's name, made anew at each step for a log while the last one is alive: its
    tensors are not shaped like the weights, so it is no EMA, and a new process makes it anew from the model. It
    was taken for an EMA dict not given to attach() whenever a look found it at an address an earlier look had
    seen (the two dicts alive in turn take two addresses: every other step), and the move was refused."""
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    job = gj.attach(model, opt)
    norms = None
    for i in range(8):
        model(torch.randn(8, 3)).pow(2).mean().backward()
        norms = {n: p.grad.norm() for n, p in model.named_parameters()}
        opt.step()
        opt.zero_grad()
        if i % 2 == 0:
            assert movability.problem(job, fresh=True) is None, (i, norms)
    assert job.report()["movable"] is True


class _Warmup(nn.Module):
    """Scales its output by a warmup its own count of calls sets, and keeps its last output (for a hook, a plot)."""

    def __init__(self, detach: bool):
        super().__init__()
        self.lin = nn.Linear(3, 1)
        self.detach = detach
        self.calls = 0
        self.last = None

    def forward(self, x):
        self.calls += 1
        out = self.lin(x) * min(1.0, self.calls / 10)
        self.last = out.detach() if self.detach else out
        return out


@pytest.mark.parametrize("detach", [False, True])
def test_a_count_beside_an_activation_kept_in_the_graph_is_carried_or_keeps_the_job_where_it_is(detach, tmp):
    """The module's last output, kept in the step's graph, leaves the module out of a checkpoint whole, its count of
    calls too: a new process started the warmup again while the reports said movable. The move is refused, naming
    the attribute; kept detached, the output is carried and so is the count."""
    torch.manual_seed(0)
    model = _Warmup(detach)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    job = gj.attach(model, opt)
    for _ in range(5):
        model(torch.randn(8, 3)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
    why = movability.problem(job, fresh=True)
    if not detach:
        assert why.startswith("its module _Warmup's attribute 'last' holds a tensor of the step's graph"), why
        return
    assert why is None
    job.checkpoint(f"{tmp}/a.ckpt")
    again = _Warmup(detach)
    gj.attach(again, torch.optim.SGD(again.parameters(), lr=0.1)).restore(f"{tmp}/a.ckpt")
    assert again.calls == 5 and torch.equal(again.last, model.last)


def test_a_list_of_nested_tensors_as_long_as_the_models_parameters_is_passed_over():
    """A batch of ragged sequences kept as nested tensors, in a list as long as the model's parameters: the look
    for an EMA kept as a list read their shapes, which nested tensors have none of, and attach() raised (and every
    report would have)."""
    model = nn.Linear(3, 1)
    batch = [torch.nested.nested_tensor([torch.randn(2), torch.randn(3)]) for _ in range(2)]
    job = gj.attach(model, torch.optim.SGD(model.parameters(), lr=0.1))
    assert movability.problem(job, fresh=True) is None and job.report()["movable"] is True
    assert len(batch) == 2


def test_an_ema_dict_made_before_torch_compile_wrapped_the_model_keeps_the_job_where_it_is():
    """The EMA keyed by the model's own names, the compiled model's keyed with "_orig_mod.": the dict was not
    seen, and the job said movable while a new process would build the EMA anew."""
    raw = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1))
    ema = {k: v.detach().clone() for k, v in raw.state_dict().items()}
    model = torch.compile(raw, backend="eager")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    job = gj.attach(model, opt)
    model(torch.randn(8, 3)).pow(2).mean().backward()
    opt.step()
    with torch.no_grad():
        for k, v in raw.state_dict().items():
            ema[k].lerp_(v, 0.1)
    assert "a dict of 4 tensors by the names of the job's module" in movability.problem(job, fresh=True)


def test_a_list_of_weak_proxies_whose_objects_are_gone_is_passed_over():
    """isinstance() asks a weak proxy for its referent's class: with the referent gone, the look for an EMA kept as
    a list raised ReferenceError out of attach() and every report, for a list as long as the model's parameters."""
    import weakref

    class Node:
        pass
    a, b = Node(), Node()
    peers = [weakref.proxy(a), weakref.proxy(b)]
    del a, b
    model = nn.Linear(3, 1)
    job = gj.attach(model, torch.optim.SGD(model.parameters(), lr=0.1))
    assert movability.problem(job, fresh=True) is None and job.report()["movable"] is True
    assert len(peers) == 2


def test_an_activation_kept_in_the_graph_beside_an_object_made_again_leaves_the_job_movable():
    """Only plain data a checkpoint would have carried is lost with the module: an object the module makes at its
    first call (a helper, a writer) is made again by the new process's forward, as before."""
    model = _Warmup(detach=False)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model.calls = 10        # (before attach: the warmup is over, the count no longer changes what it computes)
    job = gj.attach(model, opt)
    model.__dict__["_helper"] = object()
    model(torch.randn(8, 3)).pow(2).mean().backward()
    model.calls = 10
    opt.step()
    assert movability.problem(job, fresh=True) is None


def test_a_module_holding_a_weak_proxy_whose_object_is_gone_attaches():
    """isinstance() asks a weak proxy for its referent's class: the look at a module's own attributes at attach
    raised ReferenceError for one whose referent was gone."""
    import weakref

    class Owner:
        pass

    class Held(nn.Linear):
        def __init__(self, owner):
            super().__init__(3, 1)
            self.owner = weakref.proxy(owner)
    owner = Owner()
    model = Held(owner)
    del owner
    job = gj.attach(model, torch.optim.SGD(model.parameters(), lr=0.1))
    assert movability.problem(job, fresh=True) is None and job.report()["movable"] is True


def test_a_look_that_fails_on_what_the_script_holds_keeps_the_job_where_it_is_and_training(monkeypatch):
    """The movability looks walk the script's objects; one that raised went up through the report at a boundary
    into the training loop. Now the job trains on, said unmovable with the error."""
    from gmux.job import stray_tensors
    model = nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    job = gj.attach(model, opt)
    assert job.report()["movable"] is True

    def broken(job, fresh=False):
        raise ReferenceError("weakly-referenced object no longer exists")
    monkeypatch.setattr(stray_tensors, "problem", broken)
    report = job.report()
    assert report["movable"] is False
    assert report["unmovable"].startswith("gmux could not judge") and "ReferenceError: weakly" in report["unmovable"]
    assert "ReferenceError" in movability.problem(job, fresh=True)
    monkeypatch.undo()
    assert job.report()["movable"] is True


def test_a_lazy_module_not_made_yet_is_refused_by_attach_naming_what_to_do():
    """attach() before a LazyLinear's first forward raised torch's "uninitialized parameter" from gmux's internals."""
    model = nn.Sequential(nn.LazyLinear(4), nn.ReLU(), nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match=r"LazyLinear '0' has parameters not made yet .* run one forward"):
        gj.attach(model, opt)
    model(torch.randn(2, 3))
    assert gj.attach(model, opt).report()["movable"] is True


def test_a_submodule_switched_to_eval_mode_mid_run_stays_so_after_a_move(tmp):
    """BatchNorm's statistics frozen and dropout turned off at a step (`if step == 10: model.bn.eval()`), which a
    new process does not run again: its model was built in training mode, and a run moved after that step ended
    with weights up to 0.08 from an unmoved run's (BatchNorm's num_batches_tracked 21 more), its reports saying
    movable."""
    def build():
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.Dropout(0.2), nn.Linear(16, 1))
        return model, torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)

    model, opt = build()
    job = gj.attach(model, opt)
    _train(model, opt, 5)
    model[1].eval()
    model[2].eval()
    job.checkpoint(f"{tmp}/a.ckpt")
    _train(model, opt, 5)
    again, again_opt = build()
    gj.attach(again, again_opt).restore(f"{tmp}/a.ckpt")
    assert [m.training for m in again.modules()] == [True, True, False, False, True]
    _train(again, again_opt, 5)
    assert_identical(model.state_dict(), again.state_dict(), "model")


def test_a_tensor_in_state_set_anew_at_the_epochs_top_is_the_checkpoints_in_the_body(tmp):
    """A running loss kept in state= as a tensor (no .item() sync per step) and reset at the epoch's top: a restored
    epoch's body got back the checkpoint's plain values but not its tensors, so the moved run's epoch sum missed
    the steps before the move (1.52 against 18.78); an LSTM's hidden state carried across batches in state= was
    lost alike, and the weights differed."""
    script = os.path.join(os.path.dirname(IDIOMS), "state_tensor_top.py")
    run_py(script, f"{tmp}/solo.pt")
    run_py(script, f"{tmp}/first.pt", "--migrate-at", "5", "--checkpoint", f"{tmp}/a.ckpt")
    run_py(script, f"{tmp}/moved.pt", "--restore", f"{tmp}/a.ckpt")
    assert_identical(torch.load(f"{tmp}/solo.pt"), torch.load(f"{tmp}/moved.pt"), "state_tensor_top")


def test_a_loop_that_fetches_two_batches_per_step_is_moved_between_steps(tmp):
    """`for xa, ya in it: xb, yb = next(it, ...)`: a move asked for between a step's two fetches was taken at the
    second (every fetch was a boundary), and the new process paired its batches one off and left the epoch's odd
    one out: 17 steps where the solo run took 18, silently. A fetch is a boundary only after an optimizer step now
    (gmux.job.step_starts)."""
    solo, first = _solo_and_moved(tmp, "pairs")
    assert "move refused" not in first.stderr and os.path.exists(f"{tmp}/a.ckpt"), first.stderr
    moved = torch.load(f"{tmp}/moved.pt")
    assert len(solo["losses"]) == len(moved["losses"]) == 18
    assert_identical(solo, moved, "pairs")


class _BiasCorrected(torch.optim.Optimizer):
    """Momentum with Adam's bias correction, its step count kept in a plain attribute (not in `state`), as optimizers
    written for a paper often are; and a set of the steps it skipped, which no checkpoint holds."""

    def __init__(self, params, lr=0.05):
        super().__init__(params, {"lr": lr})
        self.t = 0
        self.skipped = None

    @torch.no_grad()
    def step(self, closure=None):
        self.t += 1
        for group in self.param_groups:
            for p in group["params"]:
                m = self.state[p].setdefault("m", torch.zeros_like(p))
                m.mul_(0.9).add_(p.grad, alpha=0.1)
                p.add_(m / (1 - 0.9 ** self.t), alpha=-group["lr"])


def test_a_step_count_an_optimizer_of_the_scripts_own_keeps_in_an_attribute_moves_with_it(tmp):
    """state_dict() leaves out what an optimizer keeps in its attributes: a new process started the count at 0
    again, its bias correction took the first steps' large factors again, and a run moved after 5 steps ended with
    weights up to 0.36 from an unmoved run's, its reports saying movable. What it cannot carry (a set) keeps the
    job where it is, naming it."""
    def build():
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
        return model, _BiasCorrected(model.parameters())

    model, opt = build()
    job = gj.attach(model, opt)
    _train(model, opt, 5)
    assert movability.problem(job, fresh=True) is None
    job.checkpoint(f"{tmp}/a.ckpt")
    _train(model, opt, 5)
    again, again_opt = build()
    gj.attach(again, again_opt).restore(f"{tmp}/a.ckpt")
    assert again_opt.t == 5
    _train(again, again_opt, 5)
    assert opt.t == again_opt.t == 10
    assert_identical(model.state_dict(), again.state_dict(), "model")

    opt.skipped = {3}
    assert movability.problem(job, fresh=True).startswith("its optimizer _BiasCorrected's attribute 'skipped' (a set)")
