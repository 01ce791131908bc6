"""The in-job runtime in one process: identity, memory given back, commands and their failures."""
import gc
import io
import itertools
import os
import threading
import warnings
import weakref

import pytest
import torch
from torch import nn

import gmux.job as gj
from gmux.job import strays
from gmux_testkit import OwnCosine, assert_identical


def _setup(pool_mib=16, **kw):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 4))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, 2)
    scaler = torch.amp.GradScaler("cpu")
    pool = gj.DevicePool(pool_mib << 20) if pool_mib else None
    extra = torch.arange(10, dtype=torch.float32)
    job = gj.attach(model, opt, sched, scaler, extras={"ema": extra}, state={"note": "x"}, pool=pool, **kw)
    x, y = torch.randn(16, 8), torch.randint(0, 4, (16,))

    def step():
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        job.boundary()
    return job, model, opt, step


def _values(job):
    return [t.detach().clone() for t in job.tracked.tensors()]


def test_suspend_keeps_every_object_and_gives_memory_back():
    job, model, opt, step = _setup()
    for _ in range(3):
        step()
    ids = [id(p) for p in model.parameters()] + [id(m) for m in model.modules()] + [id(opt), id(opt.state)]
    state_keys = [id(p) for p in opt.state]
    user_ref = model[0].weight
    before = _values(job)
    first = job.suspend()
    assert first["bytes"] > 0 and job.suspended
    assert user_ref.numel() == 0  # the tensor really lost its memory
    job.resume()
    # After one cycle the state lives in the pool; a second suspend must give all of it back.
    job.suspend()
    assert job.tier.pool.in_use == 0
    assert job.residue()["tensors"] == []
    job.resume()
    assert [id(p) for p in model.parameters()] + [id(m) for m in model.modules()] + [id(opt), id(opt.state)] == ids
    assert [id(p) for p in opt.state] == state_keys
    assert user_ref is model[0].weight and torch.equal(user_ref, before[0])
    assert_identical(before, _values(job))
    step()  # and training goes on


def test_views_between_tracked_tensors_stay_shared():
    torch.manual_seed(0)
    base = torch.randn(100)
    job = gj.attach(extras={"base": base, "view": base[10:20]}, pool=gj.DevicePool(1 << 20))
    job.suspend()
    job.resume()
    base[15] = 42.0
    assert job.tracked.extras["view"][5] == 42.0


def test_residue_names_what_the_runtime_was_not_told_about():
    job, model, opt, step = _setup()
    step()
    job.suspend()
    job.resume()
    kept_by_user = model[0].weight[:2]  # a view the runtime does not track
    gone = type("Gone", (), {})()
    dead_proxy = weakref.proxy(gone)    # torch.compile leaves such about; isinstance() on one raises
    del gone
    # ... and FakeTensors, whose memory cannot be read (the scan raised on one): a compiled function's first call
    fake = torch.compile(lambda x: x * 2, backend="eager")
    fake(torch.ones(3))
    job.suspend()
    names = [name for name, _ in job.residue()["tensors"]]
    assert any("kept_by_user" in n for n in names), names
    assert job.tier.pool.in_use > 0
    job.resume()
    del kept_by_user, dead_proxy, fake


def test_heap_backed_device_without_pool():
    job, model, opt, step = _setup(pool_mib=0)
    step()
    before = _values(job)
    job.suspend()
    job.resume()
    assert_identical(before, _values(job))


def test_failed_resume_stays_suspended_and_loses_nothing():
    job, model, opt, step = _setup(pool_mib=1)
    step()
    before = _values(job)
    job.suspend()
    blocker = job.tier.pool.storage(job.tier.pool.size - 8192)  # another job took the memory
    command = job.controller.send("resume")
    job.controller.send("resume")
    job.controller.send("exit")

    with pytest.raises(gj.JobExit):
        job._while_suspended()
    assert job.suspended
    assert "pool exhausted" in job.controller.result(command, timeout=5)["error"]
    del blocker
    job.resume()
    assert_identical(before, _values(job))


def test_commands_from_another_thread():
    job, model, opt, step = _setup()
    c = job.controller
    answers = {}

    def driver():
        s = c.send("suspend")
        answers["suspend"] = c.result(s, timeout=10)
        answers["resume"] = c.result(c.send("resume"), timeout=10)
        answers["again"] = c.result(c.send("resume"), timeout=10)

    t = threading.Thread(target=driver)
    t.start()
    while t.is_alive():
        step()
    assert answers["suspend"]["ok"] and answers["suspend"]["bytes"] > 0
    assert answers["resume"]["ok"]
    assert answers["again"] == {"ok": False, "error": "resume: the job is not suspended"}
    with pytest.raises(ValueError, match="unknown job command 'fly'"):
        c.send("fly")
    c.send("exit")
    with pytest.raises(gj.JobExit):
        step()


def test_checkpoint_while_suspended_equals_checkpoint_while_running(tmp):
    job, model, opt, step = _setup()
    for _ in range(2):
        step()
    assert job.checkpoint(f"{tmp}/running.ckpt")["step"] == 2     # the step it holds, said to gmuxd
    job.suspend()
    job.checkpoint(f"{tmp}/suspended.ckpt")
    job.resume()
    with open(f"{tmp}/running.ckpt", "rb") as a, open(f"{tmp}/suspended.ckpt", "rb") as b:
        assert a.read() == b.read()
    step()
    assert job.report()["step"] == 3 and job.checkpoint(f"{tmp}/later.ckpt")["step"] == 3


def test_attach_rejects_what_it_cannot_track():
    with pytest.raises(TypeError, match="cannot track a str"):
        gj.attach("model")
    with pytest.raises(TypeError, match="extras\\['x'\\] is a int"):
        gj.attach(extras={"x": 3})
    with pytest.raises(TypeError, match="is a AveragedModel, not a tensor: pass a module.* as it is"):
        gj.attach(extras={"ema": torch.optim.swa_utils.AveragedModel(nn.Linear(2, 2))})


def test_report_has_rates_and_memory():
    job, model, opt, step = _setup()
    for _ in range(5):
        step()
    r = job.report()
    assert r["step"] == 5 and r["rate"] > 0 and r["mem_boundary"] > 0 and r["mem_peak"] >= r["mem_boundary"]


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def test_spill_frees_host_memory_and_resume_is_bit_identical(tmp):
    def run(spill: bool):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 1024))   # ~32 MiB of parameters
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        job = gj.attach(model, opt, pool=gj.DevicePool(256 << 20))
        x = torch.randn(8, 1024)
        for i in range(6):
            loss = model(x).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            if spill and i == 2:
                job.suspend()
                held = _rss_bytes()
                figures = job.spill(f"{tmp}/job.spill")
                assert figures["bytes"] > 100 << 20   # parameters, grads, two Adam moments
                assert os.path.getsize(f"{tmp}/job.spill") == figures["bytes"]
                assert held - _rss_bytes() > 0.9 * figures["bytes"], "the host copy's memory was not given back"
                resumed = job.resume()
                assert resumed["unspill_s"] > 0 and not os.path.exists(f"{tmp}/job.spill")
        return [t.detach().clone() for t in job.tracked.tensors()]
    assert_identical(run(False), run(True))


def test_spill_refused_while_running_and_a_damaged_spill_file_is_named(tmp):
    job, model, opt, step = _setup()
    step()
    command = job.controller.send("spill", path=f"{tmp}/s")
    step()   # the command is carried out at this boundary
    assert job.controller.result(command, timeout=5) == {"ok": False, "error": "spill: the job is not suspended"}
    before = _values(job)
    job.suspend()
    job.spill(f"{tmp}/s")
    with open(f"{tmp}/s", "r+b") as f:
        f.seek(100)
        good = f.read(1)
        f.seek(100)
        f.write(bytes([good[0] ^ 0xFF]))
    with pytest.raises(gj.SpillError, match=f"spill file {tmp}/s: checksum mismatch"):
        job.resume()
    assert job.suspended                      # still suspended, the file kept for a second look
    with open(f"{tmp}/s", "r+b") as f:
        f.seek(100)
        f.write(good)
    job.resume()
    assert_identical(before, _values(job))


def test_the_runner_turns_every_ending_into_a_status_and_a_reason(tmp):
    import sys

    from gmux.job.runner import run_script

    cases = {"pass": (0, "finished"), "import sys; sys.exit(0)": (0, "finished"),
             "import sys; sys.exit(4)": (4, "exit status 4"), "import sys; sys.exit('bad input')": (1, "exit status 1"),
             "raise ValueError('boom')": (1, "ValueError: boom"),
             # the statuses the system sees (gmux said "exit status 300", "True", and a 2**70 broke the bye)
             "import sys; sys.exit(256)": (0, "finished"), "import sys; sys.exit(300)": (44, "exit status 44"),
             "import sys; sys.exit(-9)": (247, "exit status 247"), "import sys; sys.exit(True)": (1, "exit status 1"),
             "import sys; sys.exit(2 ** 70)": (255, "exit status 255"),
             # Ctrl-C: recorded as "failed: KeyboardInterrupt: " with status 1 before
             "raise KeyboardInterrupt": (130, "interrupted (SIGINT)")}
    argv, saved_path = list(sys.argv), list(sys.path)
    try:
        for i, (body, expected) in enumerate(cases.items()):
            path = f"{tmp}/s{i}.py"
            with open(path, "w") as f:
                f.write("import sys\nassert sys.argv[1:] == ['--x', '1']\n" + body + "\n")
            assert run_script("path", path, [path, "--x", "1"]) == expected, body
    finally:
        sys.path[:] = saved_path    # (the script's directory, put first as python does, is this test's alone)
    assert sys.argv == argv     # the script's argv was its own


@pytest.mark.parametrize("body", ["def f(x):\n    return 1 / x\n\nf(0)\n",
                                  "try:\n    {}['k']\nexcept KeyError as e:\n    raise ValueError('no k') from e\n",
                                  "raise KeyboardInterrupt\n"])
def test_a_failing_scripts_traceback_is_the_one_python_prints(tmp, capfd, body):
    """A script run by gmux that raised printed gmux's frames (the runner's, runpy's) above its own, and its path
    as given (`exc.py`), where python prints the script's frames alone, with its absolute path."""
    import subprocess
    import sys

    from gmux.job.runner import run_script

    with open(f"{tmp}/failing.py", "w") as f:
        f.write(body)
    plain = subprocess.run([sys.executable, "failing.py"], cwd=tmp, capture_output=True, text=True)
    here, saved_path = os.getcwd(), list(sys.path)
    os.chdir(tmp)
    try:
        run_script("path", "failing.py", ["failing.py"])
    finally:
        os.chdir(here)
        sys.path[:] = saved_path
    assert capfd.readouterr().err == plain.stderr and f'File "{tmp}/failing.py"' in plain.stderr


def test_what_a_script_holds_lives_on_after_it_ends_as_under_python(tmp):
    """However a script ends, its objects are not freed the moment it returns but at the interpreter's end, as
    python frees a script's __main__. Before: the runner freed them at once, and a DDP model's gloo process group,
    destroyed while gloo's thread still released its last collective, deadlocked the rank after its work was
    done (3 runs in 50 of test_ddp_hooks's script on a busy machine)."""
    import builtins
    import gc
    import sys
    import weakref

    from gmux.job.runner import run_script

    holder = "import builtins\nclass Held:\n    pass\nheld = Held()\nbuiltins._gmux_test_held.append(held)\n"
    saved_path = list(sys.path)       # (the runner puts the script's directory first, as python does)
    for i, end in enumerate(("", "import sys; sys.exit(3)", "raise ValueError('boom')")):
        path = f"{tmp}/held_{i}.py"
        with open(path, "w") as f:
            f.write(holder + end + "\n")
        builtins._gmux_test_held = []
        try:
            run_script("path", path, [path])
            ref = weakref.ref(builtins._gmux_test_held.pop())
        finally:
            del builtins._gmux_test_held
            sys.path[:] = saved_path  # (left there, a later test's `import h2`, httpx's, ran a script named h2.py)
        gc.collect()
        assert ref() is not None, f"freed when the script ended ({end or 'returned'})"

def test_gmux_launch_modules_import_no_torch():
    """gmux-launch imports torch at one chosen point (runner.warm_up), not as a side effect of importing its own
    modules: its usage errors and --help answer at once."""
    import subprocess
    import sys
    code = "import sys, gmux.cli.launch; print([m for m in ('torch', 'numpy') if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr


def test_a_move_of_a_job_whose_optimizer_gained_groups_is_refused_and_it_runs_on(tmp):
    """Progressive unfreezing (optimizer.add_param_group after attach): a move's new process would rebuild the
    optimizer without the group and die restoring, after the move had been answered done. The move is refused
    instead, naming why, nothing is written, and the job trains on; a plain checkpoint is still written."""
    torch.manual_seed(0)
    backbone, head = torch.nn.Linear(4, 4), torch.nn.Linear(4, 1)
    model = torch.nn.Sequential(backbone, head)
    opt = torch.optim.SGD(head.parameters(), lr=0.1)
    job = gj.attach(model, opt)
    assert job.report()["movable"]
    opt.add_param_group({"params": list(backbone.parameters()), "lr": 0.01})
    assert not job.report()["movable"]      # said up front, so that gmuxd neither accepts nor plans such a move
    move = job.controller.send("migrate", path=f"{tmp}/moved.ckpt")
    job.boundary()
    reply = job.controller.result(move, timeout=5)
    assert not reply["ok"] and reply["error"].startswith("optimizer 0's parameter groups changed since attach "
                                                         "(sizes [2] then, [2, 2] now)"), reply   # gmuxd says what failed
    assert not os.path.exists(f"{tmp}/moved.ckpt")
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    job.boundary()
    ckpt = job.controller.send("checkpoint", path=f"{tmp}/periodic.ckpt")
    job.boundary()
    assert job.controller.result(ckpt, timeout=5)["ok"] and os.path.exists(f"{tmp}/periodic.ckpt")


@pytest.mark.parametrize("change", ["pruned", "replaced", "half"])
def test_a_move_of_a_job_whose_module_changed_after_attach_is_refused_and_it_runs_on(tmp, change):
    """Pruning at an epoch (prune.l1_unstructured: weight becomes weight_orig and weight_mask), a layer replaced, a
    dtype changed after attach: the move was answered done, the first process left, and the new process, which
    builds the model as the script does before attach(), died restoring (StateMismatch), the job lost mid-move.
    Refused up front instead, naming the change, and the job trains on."""
    from torch.nn.utils import prune
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    job = gj.attach(model, opt)
    job.boundary()
    assert job.report()["movable"]
    said = {"pruned": "gone: 0.weight; new: 0.weight_orig, 0.weight_mask",
            "replaced": "1.weight (1, 4) torch.float32 now (2, 4) torch.float32",
            "half": "0.weight (4, 4) torch.float32 now (4, 4) torch.float16"}[change]
    if change == "pruned":
        prune.l1_unstructured(model[0], "weight", amount=0.5)
    elif change == "replaced":
        model[1] = torch.nn.Linear(4, 2)
    else:
        model[0].half()
    why = job.report()["unmovable"]
    assert why.startswith(f"module 0's parameters and buffers changed since attach ({said}") and \
        "could not take this state" in why, why     # said up front, so that gmuxd neither accepts nor plans it
    move = job.controller.send("migrate", path=f"{tmp}/moved.ckpt")
    job.boundary()
    reply = job.controller.result(move, timeout=5)
    assert not reply["ok"] and reply["error"] == why, reply
    assert not os.path.exists(f"{tmp}/moved.ckpt")
    job.boundary()          # and it runs on


def test_a_move_of_a_job_that_trains_with_an_optimizer_built_after_attach_is_refused(tmp):
    """A later stage's new optimizer (fine-tuning with Adam after SGD): a move's new process ran the script from
    its start, never reached the stage again, and trained on with SGD; the run ended "finished" with other
    weights (an outside review). The move is refused, naming why, once such an optimizer has stepped."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    job = gj.attach(model, sgd)
    model(torch.randn(2, 4)).sum().backward()
    sgd.step()
    job.boundary()
    assert job.not_rebuilt is None
    adam = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.randn(2, 4)).sum().backward()
    adam.step()
    move = job.controller.send("migrate", path=f"{tmp}/moved.ckpt")
    job.boundary()
    reply = job.controller.result(move, timeout=5)
    assert not reply["ok"] and reply["error"].startswith("an optimizer attach() was not given (Adam) steps the "
                                                         "job's parameters"), reply
    assert not os.path.exists(f"{tmp}/moved.ckpt")


def test_a_throwaway_optimizer_over_what_the_job_does_not_train_leaves_it_movable(tmp):
    """A linear probe built and trained at each evaluation (its own head, its own Adam) is rebuilt by a new
    process as it was: it made the job unmovable for good (a review)."""
    model = torch.nn.Linear(4, 4)
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    job = gj.attach(model, sgd)

    def probe():
        head = torch.nn.Linear(4, 1)
        adam = torch.optim.Adam(head.parameters())
        head(model(torch.randn(2, 4)).detach()).sum().backward()
        adam.step()
        return adam
    kept = probe()
    assert len(job.strays) == 1 and strays.problem(job) is None      # (its parameters are not the job's)
    del kept
    gc.collect()
    assert len(job.strays) == 0
    job._check_rebuildable()


class _Drawing(torch.utils.data.Dataset):
    def __len__(self):
        return 6

    def __getitem__(self, i):
        return torch.rand(2)


def test_an_epoch_a_new_process_could_not_put_back_is_reported_unmovable_while_it_lasts(tmp):
    """Persistent loader workers that draw random numbers, started in epoch 0, carry their state into epoch 1,
    which a new process cannot give new ones: asked to move then, the job refused, while its reports had said it
    was movable, so gmuxd accepted and planned such moves. The reports now say why, for that epoch only."""
    torch.manual_seed(0)
    model = nn.Linear(2, 1)
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    job = gj.attach(model, sgd)
    loader = torch.utils.data.DataLoader(_Drawing(), batch_size=2, num_workers=1, persistent_workers=True)
    said = []
    for epoch in job.epochs(2):
        for x in job.data(loader):
            model(x).sum().backward()
            sgd.step()
            sgd.zero_grad()
            report = job.report()
            said.append((epoch, report["movable"], report["unmovable"]))
    assert said[:3] == [(0, True, None)] * 3, said
    assert [(e, m) for e, m, _ in said[3:]] == [(1, False)] * 3, said
    assert said[3][2].startswith("its loader's persistent_workers were started in an earlier epoch and its dataset "
                                 "or collate function draws random numbers"), said
    move = job.controller.send("migrate", path=f"{tmp}/moved.ckpt")
    job.boundary()
    assert not job.controller.result(move, timeout=5)["ok"] and not os.path.exists(f"{tmp}/moved.ckpt")


def _says_unmovable_and_refuses(job, tmp, why):
    """Its reports say why (gmuxd then plans no move), and a move asked for all the same is refused in the job."""
    report = job.report()
    assert not report["movable"] and report["unmovable"].startswith(why), report
    move = job.controller.send("migrate", path=f"{tmp}/moved.ckpt")
    job.boundary()
    assert not job.controller.result(move, timeout=5)["ok"] and not os.path.exists(f"{tmp}/moved.ckpt")


@pytest.mark.parametrize("built", ["before attach", "after attach"])
def test_a_job_whose_lr_scheduler_was_not_attached_is_unmovable(tmp, built):
    """A StepLR the script did not give attach(): a new process built it anew, at step 0, and trained on with other
    learning rates from its next decay on, ending "finished" with other weights. Such a job now says it is
    unmovable and refuses a move; given to attach(), the same scheduler leaves it movable."""
    model = nn.Linear(4, 1)
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    early = [torch.optim.lr_scheduler.StepLR(sgd, 2)] if built == "before attach" else []
    job = gj.attach(model, sgd)
    sched = early[0] if early else torch.optim.lr_scheduler.StepLR(sgd, 2)
    model(torch.randn(2, 4)).sum().backward()
    sgd.step()
    sched.step()
    _says_unmovable_and_refuses(job, tmp, "an LR scheduler attach() was not given (StepLR) drives optimizer 0 (SGD)")
    other = nn.Linear(4, 1)
    adam = torch.optim.Adam(other.parameters())
    assert gj.attach(other, adam, torch.optim.lr_scheduler.OneCycleLR(adam, 0.5, total_steps=9)).report()["movable"]


def _one_step(model, opt):
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    opt.zero_grad()


def test_a_job_whose_plateau_scheduler_was_not_attached_is_unmovable_once_it_steps(tmp):
    """ReduceLROnPlateau marks no parameter group, so a job driven by one attach() was not given said it was
    movable: a new process built it anew, with no best metric and no patience used, and trained on with other
    learning rates from its next plateau. Built and not yet stepped, it is what the new process builds (movable);
    once it steps, the job is unmovable and refuses a move; freed, the job is movable again."""
    model = nn.Linear(4, 1)
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    job = gj.attach(model, sgd)
    plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(sgd, patience=0)
    _one_step(model, sgd)
    assert job.report()["movable"], job.report()
    plateau.step(1.0)
    _says_unmovable_and_refuses(job, tmp, "an LR scheduler attach() was not given (ReduceLROnPlateau) drives "
                                          "optimizer 0 (SGD)")
    del plateau
    gc.collect()
    assert job.report()["movable"], job.report()


def test_torchs_scheduler_warnings_name_the_scripts_line_and_not_gmuxs():
    """gmux watched step() through a wrapper of its own, and torch's warnings raised in step() one frame up
    (stacklevel=2) named gmux/job/stray_schedulers.py instead of the script's line that called step()."""
    model = nn.Linear(4, 1)
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    gj.attach(model, sgd)
    sched = torch.optim.lr_scheduler.StepLR(sgd, 2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sched.step()                    # (before any optimizer.step(): torch warns)
    assert [w.filename for w in caught if "optimizer.step()" in str(w.message)] == [__file__], \
        [(w.filename, str(w.message)) for w in caught]
    assert torch.optim.lr_scheduler.StepLR.step is torch.optim.lr_scheduler.LRScheduler.step


def test_torchs_gradscaler_warnings_name_the_scripts_line_and_an_unattached_scaler_is_still_seen(tmp):
    """gmux watched GradScaler.step() through a wrapper of its own: torch's warning raised in step() (stacklevel=2,
    for an optimizer whose step() takes grad_scaler) named gmux/job/stray_scalers.py, and a traceback from step()
    ran through gmux's frame. Now what a scaler steps is read from the scaler as its update() is looked up."""
    class TakesScaler(torch.optim.SGD):
        _step_supports_amp_scaling = True       # (torch then hands the scaler to step(), and warns that it will stop)

        def step(self, closure=None, grad_scaler=None):
            grad_scaler.unscale_(self)
            return super().step(closure)
    model = nn.Linear(4, 1)
    opt = TakesScaler(model.parameters(), lr=0.1)
    job = gj.attach(model, opt)
    scaler = torch.amp.GradScaler("cpu")
    assert torch.amp.GradScaler.step is vars(torch.amp.GradScaler)["step"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        scaler.scale(model(torch.ones(2, 4)).sum()).backward()
        scaler.step(opt)
        scaler.update()
    assert [w.filename for w in caught if "GradScaler is going to stop" in str(w.message)] == [__file__], \
        [(w.filename, str(w.message)) for w in caught]
    _says_unmovable_and_refuses(job, tmp, "an AMP GradScaler attach() was not given steps an optimizer of the job "
                                          "(TakesScaler)")


def test_a_second_scheduler_beside_an_attached_one_is_seen_and_attached_parts_are_not(tmp):
    """An unattached scheduler on an optimizer an attached one drives hid behind it ("initial_lr" is there
    either way). The parts of an attached SequentialLR step too, and are the job's."""
    model = nn.Linear(4, 1)
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    warm = torch.optim.lr_scheduler.LinearLR(sgd, start_factor=0.5, total_iters=2)
    decay = torch.optim.lr_scheduler.StepLR(sgd, 2)
    chain = torch.optim.lr_scheduler.SequentialLR(sgd, [warm, decay], milestones=[2])
    job = gj.attach(model, sgd, chain)
    for _ in range(4):
        _one_step(model, sgd)
        chain.step()
    assert job.report()["movable"], job.report()
    extra = torch.optim.lr_scheduler.ExponentialLR(sgd, 0.9)
    assert job.report()["movable"], "a scheduler only built is what the new process builds"
    _one_step(model, sgd)
    extra.step()
    _says_unmovable_and_refuses(job, tmp, "an LR scheduler attach() was not given (ExponentialLR) drives optimizer 0 "
                                          "(SGD)")


def test_accelerates_wrapped_optimizer_and_scheduler_attached_leave_the_job_movable(tmp):
    """accelerate's AcceleratedScheduler (its scheduler inside) could not be attached; attached now, its wrapped
    StepLR, stepping the torch optimizer inside the AcceleratedOptimizer, is the job's own, not a stray."""
    accelerate = pytest.importorskip("accelerate")
    model = nn.Linear(4, 1)
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    acc = accelerate.Accelerator(cpu=True)
    model, opt, sched = acc.prepare(model, sgd, torch.optim.lr_scheduler.StepLR(sgd, 2))
    job = gj.attach(model, opt, sched)
    for _ in range(3):
        _one_step(model, opt)
        sched.step()
    assert job.report()["movable"], job.report()
    plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(sgd)
    plateau.step(1.0)
    _says_unmovable_and_refuses(job, tmp, "an LR scheduler attach() was not given (ReduceLROnPlateau) drives an "
                                          "optimizer of the job (SGD)")


def test_a_scheduler_that_is_not_torchs_is_attached_by_its_state_dict_and_seen_unattached(tmp):
    """timm's schedulers (and a script's own) are not torch's LRScheduler: attach() refused them, while a job they
    drove said "give it to attach()". Now attach() keeps any object with state_dict() and load_state_dict()."""
    model = nn.Linear(4, 1)
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    job = gj.attach(model, sgd)
    own = OwnCosine(sgd)
    _one_step(model, sgd)
    own.step()
    _says_unmovable_and_refuses(job, tmp, "an LR scheduler attach() was not given drives optimizer 0 (SGD)")
    attached = gj.attach(model, sgd, own)
    attached.not_rebuilt = None         # (attached again in one process; a script attaches once)
    assert attached.tracked.schedulers == [own] and attached.report()["movable"], attached.report()


def test_a_sparse_gradient_at_the_boundary_leaves_the_job_movable(tmp):
    """An Embedding(sparse=True) with zero_grad() at the loop's top holds a sparse gradient at every boundary, which
    a checkpoint could not hold: its reports said unmovable and every move was refused. A checkpoint holds sparse
    COO tensors now: its reports say movable, and a move asked for is carried out at the boundary, the gradient in
    its checkpoint as it was."""
    emb = nn.Embedding(10, 3, sparse=True)
    sparse = torch.optim.SparseAdam(emb.parameters())
    job = gj.attach(emb, sparse)
    sparse.zero_grad()
    emb(torch.tensor([1, 2, 1])).sum().backward()
    sparse.step()
    assert emb.weight.grad.layout == torch.sparse_coo
    report = job.report()
    assert report["movable"] and report["unmovable"] is None, report
    move = job.controller.send("migrate", path=f"{tmp}/moved.ckpt")
    with pytest.raises(gj.JobExit):
        job.boundary()
    assert job.controller.result(move, timeout=5)["ok"]
    from gmux.job import checkpoint as ckpt
    assert_identical(ckpt.load(f"{tmp}/moved.ckpt")["grads"][0]["weight"], emb.weight.grad)


def test_an_optimizer_wrapper_kept_by_its_state_dict_owns_its_base():
    """An optimizer wrapper that is not a torch optimizer (a Lookahead), attached by its state_dict(), had its base
    counted as an optimizer attach() was not given, and the job was refused every move."""

    class Lookahead:        # (holds its base; its state_dict() holds the base's)
        def __init__(self, base):
            self.optimizer, self.k = base, 0

        def step(self):
            self.optimizer.step()
            self.k += 1

        def zero_grad(self):
            self.optimizer.zero_grad()

        def state_dict(self):
            return {"base": self.optimizer.state_dict(), "k": self.k}

        def load_state_dict(self, state):
            self.optimizer.load_state_dict(state["base"])
            self.k = state["k"]
    model = nn.Linear(4, 1)
    ahead = Lookahead(torch.optim.Adam(model.parameters()))
    job = gj.attach(model, ahead)
    job.not_rebuilt = None          # (attached again in one process; a script attaches once)
    _one_step(model, ahead)
    assert job.report()["movable"], job.report()


def test_an_ema_copy_attach_was_not_given_keeps_the_job_where_it_is_and_a_frozen_teacher_does_not(tmp, monkeypatch):
    """An EMA copy of the model updated by hand after each step and not given to attach(): a new process built it
    anew from the model and trained on with another EMA, while the job said it was movable. A teacher only read
    (and a compiled wrapper of the model, which holds the model's own tensors) leaves it movable; once the EMA is
    attached, it is the job's state."""
    import copy
    from gmux.job import movability, stray_modules
    monkeypatch.setattr(stray_modules, "_last_scan", [])     # (a script's process: its first attach takes a look)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    teacher = nn.Linear(4, 1).eval()
    wrapper = nn.ModuleDict({"model": model})        # (holds the model's tensors only)
    ema = copy.deepcopy(model).requires_grad_(False)
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)

    def train(job, steps, update_ema):
        for _ in range(steps):
            x = torch.randn(2, 4)
            with torch.no_grad():
                teacher(x)
            wrapper["model"](x).sum().backward()
            sgd.step()
            sgd.zero_grad()
            if update_ema:
                with torch.no_grad():
                    for e, p in zip(ema.parameters(), model.parameters()):
                        e.lerp_(p, 0.1)
            job.boundary()
    job = gj.attach(model, sgd)
    train(job, 2, update_ema=False)
    assert movability.problem(job, fresh=True) is None
    train(job, 2, update_ema=True)
    move = job.controller.send("migrate", path=f"{tmp}/moved.ckpt")
    job.boundary()
    assert not job.controller.result(move, timeout=5)["ok"] and not os.path.exists(f"{tmp}/moved.ckpt")
    # (reports look at most once a minute; the move's look is theirs from then on)
    assert job.report()["unmovable"].startswith("a module attach() was not given (Sequential) is changed in place as "
                                                "the job trains (an EMA copy of the model?)"), job.report()
    attached = gj.attach(model, sgd, ema)
    attached.not_rebuilt = None     # (attached again in one process; a script attaches once)
    train(attached, 2, update_ema=True)
    assert movability.problem(attached, fresh=True) is None


def test_an_ema_copy_built_after_attach_is_seen_by_the_next_full_look(monkeypatch):
    """A move looks again only at the modules a full look has seen (nothing added to its downtime); one built after
    attach() is seen by the next full look, which the reports take once a minute (here at every report)."""
    import copy
    from gmux.job import stray_modules
    monkeypatch.setattr(stray_modules, "_last_scan", [])
    model = nn.Linear(4, 1)
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    job = gj.attach(model, sgd)
    ema = copy.deepcopy(model).requires_grad_(False)
    monkeypatch.setattr(stray_modules, "REPORT_SCAN_S", 0.0)
    monkeypatch.setattr(stray_modules, "SCAN_SHARE", 0)
    assert job.report()["movable"]          # (first seen)
    _one_step(model, sgd)
    with torch.no_grad():
        ema.weight.lerp_(model.weight, 0.5)
    report = job.report()
    assert not report["movable"] and report["unmovable"].startswith("a module attach() was not given (Linear) is "
                                                                    "changed in place"), report


def test_a_momentum_encoder_updated_through_data_keeps_the_job_where_it_is(tmp, monkeypatch):
    """DINO's and MoCo's momentum encoders update through .data (in place on it, or assigned to it), which moves no
    version counter: the job said movable, and a move's new process trained on with an encoder built anew."""
    import copy
    from gmux.job import movability, stray_modules
    for update in ("data_in_place", "data_assigned"):
        monkeypatch.setattr(stray_modules, "_last_scan", [])     # (a script's process: its first attach looks)
        torch.manual_seed(0)
        model = nn.Linear(4, 4)
        encoder = copy.deepcopy(model).requires_grad_(False)
        sgd = torch.optim.SGD(model.parameters(), lr=0.1)
        job = gj.attach(model, sgd)
        job.not_rebuilt = None      # (attached again in one process; a script attaches once)
        assert movability.problem(job, fresh=True) is None
        for _ in range(2):
            model(torch.randn(2, 4)).sum().backward()
            sgd.step()
            sgd.zero_grad()
            for e, p in zip(encoder.parameters(), model.parameters()):
                if update == "data_in_place":
                    e.data.mul_(0.9).add_(p.detach().data, alpha=0.1)
                else:
                    e.data = e.data * 0.9 + p.data * 0.1
            job.boundary()
        assert "changed in place" in (movability.problem(job, fresh=True) or ""), update


def test_a_metric_counting_outside_the_attached_modules_keeps_the_job_where_it_is(monkeypatch):
    """A torchmetrics Metric beside the model, counting an epoch (its states are no parameters or buffers, so no
    module look saw it): a new process built it anew and computed the epoch over the batches after the move only.
    One reset at every step counts alike at every boundary and leaves the job movable; attached, it is the job's."""
    tm = pytest.importorskip("torchmetrics")
    from gmux.job import movability, stray_modules
    monkeypatch.setattr(stray_modules, "_last_scan", [])     # (a script's process: its first attach takes a look)
    model = nn.Linear(4, 3)
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    per_step, per_epoch = tm.MeanMetric(), tm.classification.MulticlassAccuracy(3)
    job = gj.attach(model, sgd)

    def train(job, steps, epoch_metric):
        """What a move at each boundary would be told."""
        told = []
        for _ in range(steps):
            logits = model(torch.randn(2, 4))
            logits.sum().backward()
            sgd.step()
            sgd.zero_grad()
            per_step.update(logits.sum().detach())
            if epoch_metric:
                per_epoch.update(logits.detach(), torch.tensor([0, 2]))
            job.boundary()
            told.append(movability.problem(job, fresh=True))
            per_step.reset()
        return told
    assert train(job, 3, epoch_metric=False) == [None] * 3
    told = train(job, 3, epoch_metric=True)
    assert told[0] is None and all(why.startswith("a torchmetrics MulticlassAccuracy attach() was not given counts as "
                                                  "the job trains") for why in told[1:]), told
    attached = gj.attach(model, sgd, per_epoch)
    attached.not_rebuilt = None     # (attached again in one process; a script attaches once)
    assert train(attached, 2, epoch_metric=True) == [None] * 2


def test_an_epoch_metric_outside_the_attached_modules_is_seen_across_its_reset(monkeypatch):
    """Looks are a minute or more apart: an epoch's Metric looked at late in one epoch and again early in the next
    (reset at the epoch's end) has fewer updates than at the last look, or only the new epoch's first, and the move
    went ahead, its new process computing that epoch without them. A validation Metric, reset before or after its
    loop and only read there, and one reset at every step, leave the job movable throughout."""
    tm = pytest.importorskip("torchmetrics")
    from gmux.job import movability, stray_modules
    monkeypatch.setattr(stray_modules, "_last_scan", [])
    model = nn.Linear(4, 3)
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    epoch_acc, val_acc, per_step = (tm.classification.MulticlassAccuracy(3), tm.classification.MulticlassAccuracy(3),
                                    tm.MeanMetric())
    job = gj.attach(model, sgd)
    x, y = torch.randn(2, 4), torch.tensor([0, 2])

    def step(counted=True):
        logits = model(x)
        logits.sum().backward()
        sgd.step()
        sgd.zero_grad()
        per_step.update(logits.sum().detach())
        if counted:
            epoch_acc.update(logits.detach(), y)
        job.boundary()
        per_step.reset()

    def epoch_end():
        if epoch_acc.update_count:
            epoch_acc.compute()
        epoch_acc.reset()
        val_acc.reset()
        for _ in range(5):
            val_acc.update(model(x).detach(), y)
        val_acc.compute()

    told = []
    for steps_before_look in (6, 3, 1, 0):         # where in each epoch a look falls
        for i in range(8):
            if i == steps_before_look:
                told.append(movability.problem(job, fresh=True))
            step()
        epoch_end()
    assert all((why or "").startswith("a torchmetrics MulticlassAccuracy attach() was not given counts")
               for why in told[:3]), told
    assert len(told) == 4 and told[3] is None, told    # (at an epoch's start it holds nothing a move loses)
    for _ in range(3):                             # (an epoch's metric not updated any more)
        for _ in range(8):
            step(counted=False)
            assert movability.problem(job, fresh=True) is None
        epoch_end()


def test_a_metric_tracker_that_made_metrics_keeps_the_job_where_it_is(tmp):
    """A MetricTracker makes a copy of its metric at each increment(): a move's new process had made fewer by the
    move, its restore was refused there and the move lost. Said up front now; before its first increment() it is
    what the new process builds."""
    tm = pytest.importorskip("torchmetrics")
    model = nn.Linear(4, 1)
    model.tracker = tm.wrappers.MetricTracker(tm.MeanMetric(), maximize=False)
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    job = gj.attach(model, sgd)
    _one_step(model, sgd)
    assert job.report()["movable"], job.report()
    model.tracker.increment()
    model.tracker.update(torch.tensor(1.0))
    _says_unmovable_and_refuses(job, tmp, "module 0's torchmetrics MetricTracker 'tracker' holds 1 copies of its "
                                          "metric made by increment()")


def test_an_uninitialized_lazy_module_attach_was_not_given_does_not_fail_attach(monkeypatch):
    """attach() looks at every module of the process: an unattached LazyLinear not yet run (its parameters refuse
    untyped_storage() with a ValueError) made attach() itself fail in the script."""
    from gmux.job import movability, stray_modules
    monkeypatch.setattr(stray_modules, "_last_scan", [])
    head = nn.LazyLinear(3)
    sparse = nn.Module()
    sparse.register_buffer("s", torch.eye(3).to_sparse())
    model = nn.Linear(4, 4)
    job = gj.attach(model, torch.optim.SGD(model.parameters(), lr=0.1))
    assert movability.problem(job, fresh=True) is None
    del head, sparse


def test_attach_again_in_the_same_job_counts_its_steps_on_restores_nothing_and_refuses_a_move(tmp, monkeypatch):
    """attach() again for a later stage made a new job: its STEP went back to 0 mid-run, and a move's new process
    restored the later stage's checkpoint into the first stage's objects and failed (StateMismatch)."""
    from gmux.job.control import LocalController
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    ctl = LocalController()
    first = gj.attach(model, torch.optim.SGD(model.parameters(), lr=0.1), controller=ctl)
    for _ in range(3):
        first.boundary()
    monkeypatch.setenv("GMUX_RESTORE", f"{tmp}/none.ckpt")    # (a moved process's first attach restored from it)
    adam = torch.optim.Adam(model.parameters(), lr=1e-3)
    job = gj.attach(model, adam, controller=ctl)
    assert job.profile.steps == 3
    move = ctl.send("migrate", path=f"{tmp}/moved.ckpt")
    job.boundary()
    reply = ctl.result(move, timeout=5)
    assert not reply["ok"] and reply["error"].startswith("attach() was called again in this process"), reply
    assert job.profile.steps == 4 and not os.path.exists(f"{tmp}/moved.ckpt")
    monkeypatch.delenv("GMUX_RESTORE")
    other = gj.attach(model, adam, controller=LocalController())     # (another controller: another job)
    assert other.profile.steps == 0 and other.not_rebuilt is None


def test_a_move_of_a_transparent_mode_job_is_refused_by_the_job_itself(tmp):
    """gmuxd refuses to move a job the hook found; a driver of its own sending migrate reaches the job, which
    refuses too rather than write a checkpoint no new process could restore and exit."""
    import subprocess
    import sys
    script = f"""
import torch
from gmux.job.control import LocalController
from gmux.job.hook import install_hook
controller = LocalController()
install_hook(controller)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
move = None
for step in range(4):
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    opt.zero_grad()
    if step == 1:
        move = controller.send("migrate", path={f"{tmp}/moved.ckpt"!r})
print("REPLY", controller.result(move, timeout=5))
print("TRAINED ON", step)
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "'ok': False" in out.stdout and "transparent-mode job" in out.stdout and "TRAINED ON 3" in out.stdout
    assert not os.path.exists(f"{tmp}/moved.ckpt")


def test_a_hooked_jobs_first_report_counts_its_models_buffers():
    """The memory a hooked job reports at its boundary is what a suspend moves: its model's buffers too, before
    any command made the hook look for the model (it showed the optimizer's tensors only until then)."""
    import subprocess
    import sys
    script = """
import torch
from gmux.job.control import LocalController
from gmux.job.hook import install_hook
job = install_hook(LocalController())
model = torch.nn.Linear(256, 256)
model.register_buffer("table", torch.zeros(1 << 20))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    model(torch.randn(2, 256)).sum().backward()
    opt.step()
    opt.zero_grad()
print("REPORTED", job.report()["mem_boundary"])
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    reported = int(out.stdout.split("REPORTED")[1])
    weights = (256 * 256 + 256) * 4
    assert reported >= (1 << 22) + weights, (reported, weights)     # the 4-MiB buffer and the weights


def test_state_the_epochs_top_changes_is_as_at_the_epochs_start_while_a_restore_runs_the_top_again():
    """A list kept in state= and shuffled in place at each epoch's top (the README's advice for such a list), a
    count the top adds to, a sum the top resets: a restore runs the top again, and it shuffled the restored (already
    shuffled) list a second time and counted the epoch twice. Now the top sees state= as at the epoch's start, and
    the body the checkpoint's values."""
    import random

    def run(restore=None):
        random.seed(0)
        order, state = list(range(6)), {}
        state.update(order=order, epochs_begun=0, running=0.0, seen=[])
        job = gj.attach(nn.Linear(2, 1), state=state)
        if restore is not None:
            job.restore(io.BytesIO(restore))
        sink = None
        for epoch in job.epochs(3):
            random.shuffle(order)
            state["epochs_begun"] += 1
            state["running"] = 0.0
            for i, k in job.enumerate(order):
                state["running"] += k
                state["seen"].append((epoch, k))
                if (epoch, i) == (1, 2) and restore is None:
                    sink = io.BytesIO()
                    job.checkpoint(sink)
        assert state["order"] is order
        return dict(state), sink

    unmoved, sink = run()
    moved, _ = run(restore=sink.getvalue())
    assert moved == unmoved and unmoved["epochs_begun"] == 3


def test_a_value_in_state_deepcopy_refuses_does_not_end_the_epochs_loop():
    """job.epochs copies state= at each epoch's top: a lock or an iterator kept there raised a TypeError out of it
    into the training loop, where it ran before (a checkpoint refuses such a value by name)."""
    import threading
    state = {"lock": threading.Lock(), "it": (k for k in range(3)), "count": 0}
    job = gj.attach(nn.Linear(2, 1), state=state)
    for _ in job.epochs(2):
        state["count"] += 1
    assert state["count"] == 2 and job.position.epoch_state == {"count": 1}


def test_a_restored_epoch_is_counted_on_by_job_enumerate_and_enumerate_is_warned_of(capfd):
    """enumerate(job.data(...)) starts at 0 again mid-epoch after a restore (not fixable: the builtin counts);
    job.enumerate goes on from the restored index, and the builtin's use (or itertools.islice's) is named on stderr."""
    data = [torch.full((2, 2), float(k)) for k in range(6)]
    job = gj.attach(nn.Linear(2, 1))
    sink = io.BytesIO()
    for _ in job.epochs(1):
        for i, x in job.enumerate(data):
            assert x[0, 0] == i
            if i == 3:
                job.checkpoint(sink)
    capfd.readouterr()
    for counting in ("job.enumerate", "enumerate"):
        other = gj.attach(nn.Linear(2, 1))
        other.restore(io.BytesIO(sink.getvalue()))
        for _ in other.epochs(1):
            seen = [(i, int(x[0, 0])) for i, x in (other.enumerate(data) if counting == "job.enumerate"
                                                   else enumerate(other.data(data)))]
        err = capfd.readouterr().err
        if counting == "job.enumerate":
            assert seen == [(4, 4), (5, 5)] and "gmux:" not in err
        else:
            assert seen == [(0, 4), (1, 5)]
            assert err.count("restored 4 batches in, and enumerate(job.data(...)) counts from 0 again") == 1
    other = gj.attach(nn.Linear(2, 1))
    other.restore(io.BytesIO(sink.getvalue()))
    for _ in other.epochs(1):
        assert len(list(itertools.islice(other.data(data), 1))) == 1
    assert "islice(job.data(...)) counts from 0 again" in capfd.readouterr().err


def test_a_move_of_an_epoch_counted_by_enumerate_is_answered_with_a_warning(tmp):
    """The restore's warning reached only the job's log, after gmux migrate had said 'migrated'; the move's answer
    carries it (gmuxd passes it on, gmux migrate prints it). job.enumerate's epoch moves without one."""
    from gmux.job.job import JobExit
    data = [torch.full((2, 2), float(k)) for k in range(6)]
    for counting in ("enumerate", "job.enumerate"):
        job = gj.attach(nn.Linear(2, 1))
        with pytest.raises(JobExit):
            for _ in job.epochs(1):
                for i, x in (enumerate(job.data(data)) if counting == "enumerate" else job.enumerate(data)):
                    if i == 2:
                        move = job.controller.send("migrate", path=f"{tmp}/{counting}.ckpt")
        reply = job.controller.result(move, timeout=5)
        assert reply["ok"] and os.path.exists(f"{tmp}/{counting}.ckpt")
        if counting == "enumerate":
            assert reply["warning"].startswith("the script counts this epoch's batches with enumerate(job.data(...)), "
                                               "which counts from 0 again in the new process (3 batches in)")
        else:
            assert "warning" not in reply


def test_a_loader_read_after_the_epochs_own_has_boundaries_but_a_move_waits_for_the_next_epoch(tmp):
    """Validation through job.data: its fetches are boundaries (a suspend there is fine), but a checkpoint there
    could not be resumed (a new process would train the epoch's rest again), so a move asked for during it is
    carried out once the training loader has fetched its next batch, before the script is given it;
    job.enumerate over it counts its own batches."""
    from gmux.job.job import JobExit
    train, val = [torch.full((2, 2), float(k)) for k in range(4)], [torch.zeros(2, 2) for _ in range(3)]
    job = gj.attach(nn.Linear(2, 1))
    seen, at_move = [], None
    try:
        for epoch in job.epochs(2):
            for x in job.data(train):
                seen.append(("train", epoch, job.position.index))
            for i, x in job.enumerate(val):
                seen.append(("val", epoch, i))
                if epoch == 0 and i == 0:
                    job.controller.send("migrate", path=os.path.join(tmp, "m.ckpt"))
    except JobExit:
        at_move = (job.position.epoch, job.position.index)
    assert [s for s in seen if s[0] == "val"] == [("val", 0, 0), ("val", 0, 1), ("val", 0, 2)]
    assert at_move == (1, 1) and os.path.exists(os.path.join(tmp, "m.ckpt"))   # epoch 1's first batch fetched
    assert job.profile.steps == 4 + 3        # before each fetch after the first (the last finds the end)
    assert seen[-1] == ("val", 0, 2)         # (and not given to the script)


def test_a_checkpoint_on_a_full_disk_says_which_file(tmp_path):
    """The refusal said "[Errno 28] No space left on device", and not where."""
    from gmux_testkit import full_filesystem
    full = tmp_path / "full"
    full.mkdir()
    with full_filesystem(full, "64k"):
        job, model, opt, step = _setup()
        step()
        path = str(full / "c.ckpt")
        command = job.controller.send("checkpoint", path=path)
        step()
        error = job.controller.result(command, timeout=10)["error"]
        assert error == f"{path}: No space left on device", error


def test_an_optimizer_a_tracked_one_wraps_stepping_inside_it_leaves_the_job_movable(tmp):
    """A wrapper attached (SAM, ZeroRedundancyOptimizer) steps the optimizer it holds: that one is the job's."""
    class Wrapper(torch.optim.Optimizer):
        def __init__(self, params, inner):
            self.inner = inner                # (held in a list, or in a wrapper of its own)
            super().__init__(params, {})

        def step(self, closure=None):
            for opt in self.inner:
                opt.step()

    model = torch.nn.Linear(4, 1)
    nested = Wrapper(model.parameters(), [torch.optim.SGD(model.parameters(), lr=0.1)])
    wrapper = Wrapper(model.parameters(), [nested])
    job = gj.attach(model, wrapper)
    model(torch.randn(2, 4)).sum().backward()
    wrapper.step()
    assert len(job.strays) == 0
    job._check_rebuildable()


def test_a_job_data_read_again_reads_its_loader_again_as_the_loader_itself_would():
    """`batches = job.data(loader)` made once and read each epoch, or cycled by a generator of the script's own: an
    ended iterator gave nothing (each later epoch trained on nothing, silently; the generator spun without end).
    Read again it is a new epoch of its loader, shuffled as a `for` over the loader itself shuffles; its length is
    the loader's (it had none)."""
    def loader():
        return torch.utils.data.DataLoader(torch.arange(12.0), batch_size=4, shuffle=True,
                                           generator=torch.Generator().manual_seed(3))
    plain = loader()
    expected = [[b.tolist() for b in plain] for _ in range(3)]
    job = gj.attach(nn.Linear(2, 1))
    kept, counted = job.data(loader()), job.enumerate(loader())
    assert [[b.tolist() for b in kept] for _ in range(3)] == expected
    assert [[(i, b.tolist()) for i, b in counted] for _ in range(2)] == [list(enumerate(e)) for e in expected[:2]]

    def forever(batches):
        while True:
            yield from batches
    endless = forever(job.data(loader()))
    assert [next(endless).tolist() for _ in range(9)] == [b for e in expected for b in e]
    assert job.position.index == 3 and job.position.cycled is None
    # (and its length is the loader's: a progress bar's total, steps per epoch from a job.data kept for each)
    from tqdm import tqdm
    assert len(kept) == len(counted) == 3 and tqdm(job.data(loader()), disable=True).total == 3
    with pytest.raises(TypeError, match=r"job.data's loader \(generator\) has no length"):
        len(job.data(x for x in range(3)))


def test_itertools_cycle_over_job_data_refuses_a_move_in_its_first_pass_and_says_so_when_it_gives_it_again(
        tmp, capfd):
    """cycle() keeps the batches of its first pass and then gives them again without reading job.data: a new
    process's cycle would keep only those after the checkpoint, and after the first pass no boundary is marked
    and nothing could resume. A move in the first pass is refused by name and the job runs on; once the pass
    ends, stderr says so once and the reports say unmovable."""
    data = [torch.full((2,), float(k)) for k in range(4)]
    job = gj.attach(nn.Linear(2, 1))
    batches = itertools.cycle(job.data(data))
    assert [int(next(batches)[0]) for _ in range(2)] == [0, 1]
    move = job.controller.send("migrate", path=os.path.join(tmp, "m.ckpt"))
    assert [int(next(batches)[0]) for _ in range(2)] == [2, 3]     # (the move's answer: at the next fetch)
    reply = job.controller.result(move, timeout=5)
    assert not reply["ok"] and "through itertools.cycle, which keeps the batches of its first pass" in reply["error"]
    assert not os.path.exists(os.path.join(tmp, "m.ckpt")) and job.report()["movable"]
    assert [int(next(batches)[0]) for _ in range(6)] == [0, 1, 2, 3, 0, 1]
    err = capfd.readouterr().err
    assert err.count("gmux: itertools.cycle(job.data(...)) gives the batches of its first pass again") == 1
    assert not job.report()["movable"] and "itertools.cycle(job.data(...))" in job.report()["unmovable"]


def test_a_pass_read_on_in_a_later_epoch_after_another_loader_there_keeps_the_job_where_it_is():
    """A job.data made once, broken out of in one epoch and read on in the next after another loader became that
    epoch's: a new process could not replay both, so no move that epoch (the next one's loader moves again)."""
    a, b = [torch.full((2,), float(k)) for k in range(6)], [torch.zeros(2)] * 2
    job = gj.attach(nn.Linear(2, 1))
    kept, seen = job.data(a), []
    for epoch in job.epochs(3):
        if epoch == 1:
            seen += [0 for _ in job.data(b)]
        for x in kept:
            seen.append(int(x[0]))
            if len(seen) == 2:
                break
        if epoch == 1:
            assert "a pass over an earlier epoch's loader goes on" in job.report()["unmovable"]
    assert seen == [0, 1, 0, 0, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5] and job.report()["movable"]


def test_a_move_after_passes_read_outside_job_epochs_inside_a_for_loop_warns_that_it_starts_again(tmp, capfd):
    """`for epoch in range(n)` of the script's own: the new process's loop starts from its first epoch again and
    trains the passes before the move once more, silently. The move's answer and the restore say so, naming the
    loop; a while loop by steps (its count kept in state=) goes on as it was and nothing is said (it was warned
    of too), nor within job.epochs, nor of a loop around attach() (each turn a job of its own)."""
    from gmux.job.job import JobExit
    data = [torch.zeros(2)] * 3

    def one_epoch(job, epoch):
        nonlocal move
        for _ in job.data(data):
            if epoch == 2 and job.position.index == 1:
                move = job.controller.send("migrate", path=f"{tmp}/{loop}.ckpt")

    move = None
    for loop in ("own", "while", "job.epochs"):
        job = gj.attach(nn.Linear(2, 1), state={"step": 0})
        with pytest.raises(JobExit):
            if loop == "while":
                while job.state["step"] < 9:
                    for _ in job.data(data):
                        job.state["step"] += 1
                        if job.state["step"] == 7:
                            move = job.controller.send("migrate", path=f"{tmp}/{loop}.ckpt")
            else:
                for epoch in (range(3) if loop == "own" else job.epochs(3)):
                    one_epoch(job, epoch)
        reply = job.controller.result(move, timeout=5)
        assert reply["ok"]
        capfd.readouterr()
        gj.attach(nn.Linear(2, 1), state={"step": 0}).restore(f"{tmp}/{loop}.ckpt")
        err = capfd.readouterr().err
        if loop == "own":
            line = next(i for i, text in enumerate(open(__file__), 1) if "in (range(3) if loop ==" in text)
            said = (f"the job read 2 passes over its loader to the end outside job.epochs: the script's loop "
                    f"`for epoch in (range(3) if loop == \"own\" else job.epochs(3)):` at test_runtime.py:{line} "
                    f"starts again from its first iteration in the new process and trains 2 more")
            assert said in reply["warning"], reply
            assert err.count(f"gmux: restored: {said}") == 1, err
        else:
            assert "warning" not in reply and "gmux:" not in err, (reply, err)


def test_a_crafted_loop_in_a_checkpoint_is_said_with_its_escape_codes_escaped(tmp, capfd):
    """The loop a checkpoint names is the file's to say: read from a crafted one, it must not reach the terminal
    as control codes."""
    from gmux.job.data import DataPosition
    job = gj.attach(nn.Linear(2, 1))
    job.position = DataPosition(passes=1, own_loop="`for e in x:` \x1b[2J\x1b]0;owned\x07 at t.py:1")
    job.checkpoint(f"{tmp}/c.ckpt")
    capfd.readouterr()
    gj.attach(nn.Linear(2, 1)).restore(f"{tmp}/c.ckpt")
    err = capfd.readouterr().err
    assert "\x1b" not in err and "\\x1b[2J\\x1b]0;owned\\x07" in err, err


def _drawing_run(restore=None, stop_at=None, again=None):
    """job.epochs over a shuffled loader, a draw between attach and the loop and at each epoch's top, dropout-like
    noise in each step; `stop_at`: the checkpoint taken there (returned); `again`: one taken right after the
    restore ("restore") or at the restored epoch's top ("top"), before its replay (returned)."""
    torch.manual_seed(0)
    loader = torch.utils.data.DataLoader(torch.arange(12.0).view(6, 2), batch_size=2, shuffle=True)
    job = gj.attach(nn.Linear(2, 1), state={"seen": [], "tops": []})
    sink = io.BytesIO()
    if restore is not None:
        job.restore(io.BytesIO(restore))
        if again == "restore":
            job.checkpoint(sink)
            return sink.getvalue()
    probe = torch.rand(2).tolist()
    for _ in job.epochs(3):
        job.state["tops"].append(torch.rand(1).item())
        if again == "top":
            job.checkpoint(sink)
            return sink.getvalue()
        for b in job.data(loader):
            job.state["seen"].append((b[0, 0] + torch.rand(1)).item())
            if len(job.state["seen"]) == stop_at:
                job.checkpoint(sink)
                return sink.getvalue()
    return probe, job.state["seen"], job.state["tops"]


def test_a_restored_job_draws_before_its_loop_as_the_first_did_and_a_checkpoint_then_holds_the_first_ones():
    """Restored, the streams were the checkpoint's at once: what the script drew between attach and its loop took
    them, and the loop's draws after the replay differed from an unmoved run's. They stay the process's own until
    the replay; a checkpoint taken before it (a move again at once, or at the restored epoch's top) writes the
    streams and state= the first checkpoint held, not what the script drew meanwhile."""
    solo = _drawing_run()
    for at in (2, 3, 5):
        first = _drawing_run(stop_at=at)
        assert _drawing_run(restore=first) == solo, at
        for again in ("restore", "top"):
            assert _drawing_run(restore=_drawing_run(restore=first, again=again)) == solo, (at, again)


def test_a_boundary_at_an_epochs_top_before_a_pass_left_in_the_last_one_is_read_on_is_no_place_for_a_move(tmp):
    """job.data made once, broken out of in one epoch and read on in the next: a job.boundary() at the next epoch's
    top, before the pass is read on, took a move at index 0 of that epoch (no loader read yet), and the new process
    began the epoch with a new pass from its start where this one went on with the pass. The move waits for the
    pass's next fetch, and goes on from there."""
    from gmux.job.job import JobExit
    data = [torch.full((2,), float(k)) for k in range(6)]
    job = gj.attach(nn.Linear(2, 1))
    kept = job.data(data)
    with pytest.raises(JobExit):
        for epoch in job.epochs(3):
            if epoch == 1:
                move = job.controller.send("migrate", path=f"{tmp}/m.ckpt")
                job.boundary()
                assert not job.position.movable()
            for _ in kept:
                if job.position.index == 2:
                    break
    assert job.controller.result(move, timeout=5)["ok"]
    assert (job.position.epoch, job.position.index) == (1, 2)


@pytest.mark.xfail(strict=True, reason="not fixed: a job.boundary() after breaking out of a job.data made once looks "
                                       "like one inside its loop (the pass is under way, with batches left)")
def test_a_boundary_after_breaking_out_of_a_job_data_made_once_is_no_place_for_a_move(tmp):
    """job.data made once, broken out of at a step budget, then job.boundary() after the loop (a scheduler's step):
    the move is taken at the pass's index, and the new process runs the epoch's loop again from there (its break
    condition passed already: it reads on to the pass's end) and steps the scheduler twice."""
    data = [torch.full((2,), float(k)) for k in range(6)]
    job = gj.attach(nn.Linear(2, 1))
    kept = job.data(data)
    for epoch in job.epochs(1):
        for _ in kept:
            if job.position.index == 2:
                break
        job.controller.send("migrate", path=f"{tmp}/m.ckpt")
        assert not job.position.movable()


def test_itertools_cycle_over_job_data_made_on_a_line_that_made_another_first_is_seen(tmp):
    """job.data called from one helper for validation and for a cycled training loader: validation's pass ended
    first, the line was marked looked, the cycle's end went unseen, and a move in a later validation (then the
    epoch's loader, outside job.epochs) was taken while the cycle gives kept batches. Each loader of a line is
    looked at (a few)."""
    train, val = [torch.full((2,), float(k)) for k in range(4)], [torch.zeros(2)] * 3
    job = gj.attach(nn.Linear(2, 1))

    def batches(loader):
        return job.data(loader)
    cycled = itertools.cycle(batches(train))
    for step in range(6):
        next(cycled)
        if step == 1:
            for _ in batches(val):
                pass
    assert job.position.cycled is not None


def test_a_failing_scripts_status_and_reason_survive_a_broken_stderr(tmp, monkeypatch):
    """`gmux-launch -- python train.py 2>&1 | tee log` ended by Ctrl-C (tee gone first), or `... | head`: the
    traceback's write raised BrokenPipeError out of the runner, no exit record was written and gmux ps said the job
    was "lost: ... killed by a signal from outside gmux (kill, the OOM killer)"."""
    import sys

    from gmux.job.runner import run_script

    class Broken:
        def write(self, _):
            raise BrokenPipeError(32, "Broken pipe")

        def flush(self):
            raise BrokenPipeError(32, "Broken pipe")

    saved_path = list(sys.path)
    monkeypatch.setattr(sys, "stderr", Broken())
    try:
        for i, (body, expected) in enumerate({"raise ValueError('boom')": (1, "ValueError: boom"),
                                              "raise KeyboardInterrupt": (130, "interrupted (SIGINT)"),
                                              "import sys; sys.exit('bad input')": (1, "exit status 1")}.items()):
            path = f"{tmp}/b{i}.py"
            with open(path, "w") as f:
                f.write(body + "\n")
            assert run_script("path", path, [path]) == expected, body
    finally:
        sys.path[:] = saved_path
