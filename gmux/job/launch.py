"""gmux-launch: turns `python train.py ...` into a gmux job, in this very process.

Steps: register with gmuxd (admission: it gives a job id, a token and a GPU), wait until told to start (the
GPU may be time-sliced among several jobs), set the GPU in the environment, install the runtime's
transparent boundary hook with the agent as its controller, then run the script with runpy as `__main__`.
The script is not modified and runs in this process, so the hook sees its optimizer steps.

Migration (and spilling to disk) end the job's run at a boundary with its state in a checkpoint; the launcher
then re-executes itself (same pid, so the shell that started it still waits on it), re-registers with the
same job id and token, and when started again runs the script with GMUX_RESTORE pointing at the checkpoint.
"""
from __future__ import annotations

import os
import runpy
import sys
import traceback
from dataclasses import dataclass
from typing import Optional

from gmux.job import control
from gmux.job.agent import Agent
from gmux.rundir import RuntimeDir, my_starttime, write_exit


@dataclass
class LaunchOptions:
    argv: list
    runtime_dir: str
    mem: Optional[int] = None
    weight: float = 1.0
    gpus: int = 1
    name: Optional[str] = None
    hook: bool = True            # transparent mode; --no-hook for scripts that attach() themselves
    job: Optional[str] = None    # set when gmuxd spawned us, or after re-executing for a migration
    token: Optional[str] = None
    restore: Optional[str] = None
    gpu: Optional[int] = None    # pin to this GPU
    gang: Optional[dict] = None  # {id, rank, size}: one rank of a torch.distributed job


def script_of(argv: list) -> tuple[str, str, list]:
    """('path'|'module', target, sys.argv for it) from `python [-u] train.py args`, `python -m mod args`
    or `train.py args`."""
    args = list(argv)
    if args and os.path.basename(args[0]).startswith("python"):
        args = args[1:]
        while args and args[0].startswith("-") and args[0] != "-m":
            if args[0] in ("-c",):
                raise SystemExit("gmux-launch runs a script or a module (-m), not python -c")
            args = args[1:]   # interpreter flags (-u, -O, ...) do not change what runs
        if args and args[0] == "-m":
            if len(args) < 2:
                raise SystemExit("gmux-launch: python -m needs a module name")
            return "module", args[1], args[1:]
    if not args or not args[0].endswith(".py") and not os.path.isfile(args[0]):
        raise SystemExit(f"gmux-launch runs Python training scripts in its own process; got {argv!r}. "
                         f"Write: gmux-launch -- python train.py ARGS")
    return "path", args[0], args


def run(opt: LaunchOptions) -> int:
    kind, target, script_argv = script_of(opt.argv)
    rundir = RuntimeDir(opt.runtime_dir)
    agent = Agent(rundir.endpoint, opt.job, opt.token)
    try:
        reg = agent.register(pid=os.getpid(), starttime=my_starttime(), argv=list(opt.argv), cwd=os.getcwd(),
                             name=opt.name, weight=opt.weight, mem=opt.mem, gpus=opt.gpus,
                             gpu=None if opt.job else opt.gpu, migratable=not opt.hook,
                             gang=None if opt.job else opt.gang)
    except Exception as e:
        print(f"gmux-launch: {e}", file=sys.stderr)
        return 2
    job_id = reg["job"]
    os.environ.update(reg["env"])
    os.environ.update({"GMUX_JOB_ID": job_id, "GMUX_RUNTIME_DIR": rundir.root})
    # Admitted; now wait for our turn on the GPU (immediately, when it is free).
    start = agent.wait()
    while start.kind != "resume":
        if start.kind == "exit":
            agent.reply(start, {"ok": True, "started": False})
            write_exit(rundir, job_id, 0, "told to exit before starting")
            agent.bye(0, "told to exit before starting")
            return 0
        # Not started: there is no state to suspend, checkpoint or move (gmuxd moves a waiting job itself).
        agent.reply(start, {"ok": False, "error": f"{start.kind}: the job has not started"})
        start = agent.wait()
    os.environ.update(start.args.get("env") or {})
    if opt.restore:
        os.environ["GMUX_RESTORE"] = opt.restore
    else:
        os.environ.pop("GMUX_RESTORE", None)

    def first_boundary() -> None:
        if opt.restore:
            _check_restored(agent, rundir, opt.restore)
        # The start is acknowledged only now: until the script reaches its first boundary (importing torch,
        # building the model, restoring a checkpoint: seconds on a busy machine) it trains nothing, and its
        # quantum, which starts with the acknowledgement, would be spent before its first mini-batch.
        agent.reply(start, {"ok": True, "started": True})
    agent.on_first_boundary = first_boundary
    status, reason = 0, "finished"
    saved_argv = sys.argv
    try:
        control.set_default(agent)
        if os.environ.get("GMUX_NATIVE", "1") != "0":  # GMUX_NATIVE=0: torch's own allocator, state tier
            from gmux.job.allocator import route_this_job
            route_this_job()
        if opt.hook:
            from gmux.job import install_hook
            install_hook(controller=agent)
        agent.state = "running"
        sys.argv = list(script_argv)
        if kind == "module":
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            sys.path.insert(0, os.path.dirname(os.path.abspath(target)))
            runpy.run_path(target, run_name="__main__")
    except SystemExit as e:   # includes gmux.job.JobExit (exit or migrate at a boundary)
        if agent.migrating is not None:
            _reexec(agent, opt, agent.migrating.get("path"))
        code = e.code
        status = code if isinstance(code, int) else (0 if code is None else 1)
        reason = "finished" if status == 0 else f"exit status {status}"
        if code is not None and not isinstance(code, int):
            print(code, file=sys.stderr)
    except BaseException as e:
        traceback.print_exc()
        status, reason = 1, f"{type(e).__name__}: {e}"[:500]
    finally:
        sys.argv = saved_argv
    write_exit(rundir, job_id, status, reason)
    agent.bye(status, reason)
    agent.close()
    return status


def _reexec(agent: Agent, opt: LaunchOptions, path: Optional[str]) -> None:
    """Becomes a fresh interpreter (same pid) that re-registers and restores from the checkpoint."""
    agent.close()   # linger lets the migrate result leave first
    # The token travels in the environment, not on the command line that `ps` shows to everyone.
    os.environ["GMUX_JOB_TOKEN"] = agent.token
    cmd = [sys.executable, "-m", "gmux.cli.launch", "--runtime-dir", opt.runtime_dir, "--job", agent.job,
           "--weight", repr(opt.weight), "--gpus", str(opt.gpus)]
    if opt.mem is not None:
        cmd += ["--mem", str(opt.mem)]
    if not opt.hook:
        cmd += ["--no-hook"]
    if path:
        cmd += ["--restore", path]
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, cmd + ["--", *opt.argv])


def _check_restored(agent: Agent, rundir: RuntimeDir, path: str) -> None:
    """After a migration the script must have restored its state before its first boundary. If it did not,
    it is training from scratch: stop loudly (the checkpoint stays on disk) rather than lose the work silently."""
    import gmux.job
    job = gmux.job.current()
    if job is not None and job.profile.steps > 1:
        return
    msg = (f"job {agent.job} was moved with its state in {path}, but the script did not restore it: attach "
           f"its state with gmux.job.attach() (which restores it) before its first step; stopped instead of training from "
           f"scratch (the checkpoint is kept)")
    print(f"gmux-launch: {msg}", file=sys.stderr)
    write_exit(rundir, agent.job, 3, msg)
    agent.bye(3, msg)
    agent.close()
    os._exit(3)
