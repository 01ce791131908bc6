"""gmux-launch: turns `python train.py ...` into a gmux job, in this very process.

Steps: register with gmuxd (admission: it gives a job id, a token and a GPU), wait until told to start (the
GPU may be time-sliced among several jobs), set the GPU in the environment, then run the script through the
runner shared with `python -m gmux.job.run` (runner.py: device memory, the transparent hook with the agent as
its controller, runpy as `__main__`). The script is not modified and runs in this process, so the hook sees
its optimizer steps. What is launch's own: gmuxd, its start, the exit record, and the re-exec after a move.

Migration (and spilling to disk) end the job's run at a boundary with its state in a checkpoint; the launcher
then re-executes itself (same pid, so the shell that started it still waits on it), re-registers with the
same job id and token, and when started again runs the script with GMUX_RESTORE pointing at the checkpoint.
"""
from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import stat
import sys
import time
from dataclasses import dataclass
from typing import Optional

from gmux import protocol
from gmux.job import control, held_signals, launch_signals, lease_watch, runner
from gmux.job.agent import Agent, DaemonUnavailable, not_alone
from gmux.job.foreground import fork_if_in_foreground
from gmux.job.log_output import keep_going_on_full_disk
from gmux.job.open_files import WAIT_S, flush_open_files, within
from gmux.job.restore_wait import restore_wait
from gmux.util.job_command import interpreter_options, missing_script, script_of
from gmux.rundir import RuntimeDir, alive, my_starttime, write_exit
from gmux.util.process_tree import keep_orphans

REGISTER_WAIT_S = 3600.0    # how long a job gmuxd accepted waits for a gmuxd to take it up before it gives up


@dataclass
class LaunchOptions:
    argv: list
    runtime_dir: str
    mem: Optional[int] = None
    mem_soft: bool = False       # --mem is a declaration for admission only, not a limit (GMUX_MEM_SOFT=1)
    weight: float = 1.0
    gpus: int = 1
    name: Optional[str] = None
    hook: bool = True            # transparent mode; --no-hook for scripts that attach() themselves
    job: Optional[str] = None    # set when gmuxd spawned us, or after re-executing for a migration
    token: Optional[str] = None
    restore: Optional[str] = None
    gpu: Optional[int] = None    # pin to this GPU
    gang: Optional[dict] = None  # {id, rank, size}: one rank of a torch.distributed job
    torchrun: bool = False       # a worker torchrun started: its rendezvous is in the environment already


def run(opt: LaunchOptions) -> int:
    try:
        kind, target, script_argv = script_of(opt.argv)
        problem = missing_script(kind, target, os.getcwd())
        if problem:
            raise ValueError(problem)
    except FileNotFoundError:
        print("gmux-launch: this directory no longer exists", file=sys.stderr)
        return 2
    except ValueError as e:
        print(f"gmux-launch: {e}", file=sys.stderr)
        return 2
    rundir = RuntimeDir(opt.runtime_dir)
    if _restore_lost(rundir, opt.job, opt.restore):
        return 2
    if opt.job is None and not opt.torchrun:
        fork_if_in_foreground()     # (an interactive shell would see gmuxd's stops as its job stopped)
    keep_orphans()      # a daemon the job double-forks stays in its tree: stopped, continued and killed with it
    held = launch_signals.held_ends(rundir, opt.job, opt.restore)
    carried = held_signals.carried(os.environ.pop(held_signals.ENV, None))   # (from a move's old process)
    handled = held_signals.carried(os.environ.pop(held_signals.HANDLED, None))
    restoring = None
    if opt.restore:     # (until restored, the script's handlers wait, and Ctrl-C stays the launcher's)
        restoring = held_signals.Restoring(handled, aside=(signal.SIGINT,) if held["handler"] is not None else ())
        held["restoring"] = True
    keep_going_on_full_disk(rundir.logs())
    # before registering: a registered job must be ready to run when it is given the GPU
    runner.warm_up(target if kind == "path" else None)
    try:
        with held["while_waiting"]():       # (a move's new process may wait an hour for a gmuxd)
            agent, reg = _register(rundir, opt, pid=os.getpid(), starttime=my_starttime(), argv=list(opt.argv),
                                   cwd=os.getcwd(), name=opt.name, weight=opt.weight, mem=opt.mem, gpus=opt.gpus,
                                   gpu=None if opt.job else opt.gpu, migratable=not opt.hook,
                                   gang=None if opt.job else opt.gang, agrees=bool(opt.gang and opt.hook))
    except Exception as e:
        print(f"gmux-launch: {_in_option_words(e)}", file=sys.stderr)
        return 2
    job_id = reg["job"]
    held["agent"] = agent
    agent.while_waiting = held["while_waiting"]
    lease = _seconds(os.environ.get("GMUX_LEASE_S"))
    if lease:
        agent.lease_s = lease
        agent.on_lease_lost = lambda waited: _lease_lost(agent, rundir, waited)
        lease_watch.start(job_id, rundir, lease)     # (one that sends gmuxd nothing hears nothing of it)
    # The limit is what gmuxd admitted the job with: its --mem, or a submitted job's (gmux submit --mem).
    mem_limit = reg.get("mem", opt.mem)
    if opt.mem_soft:
        os.environ["GMUX_MEM_SOFT"] = "1"   # kept across a migration's re-exec, like the rest of the environment
    os.environ.update(reg["env"])
    # (the directory as one spelling of it: gmuxd finds the job's processes by it, gmux.node.supervisor)
    os.environ.update({"GMUX_JOB_ID": job_id, "GMUX_RUNTIME_DIR": os.path.realpath(rundir.root)})
    # Admitted; now wait for our turn on the GPU (immediately, when it is free).
    try:
        start = _wait_for_start(agent)
    except DaemonUnavailable as e:      # (a gmuxd that lost its table and would not take the job back)
        print(f"gmux-launch: {e}", file=sys.stderr)
        write_exit(rundir, job_id, 2, str(e))
        return 2
    if start is None:
        write_exit(rundir, job_id, 0, "told to exit before starting")
        agent.bye(0, "told to exit before starting")
        return 0
    lost = _restore_lost(rundir, job_id, opt.restore)     # (deleted while the job waited for its turn)
    if lost:
        agent.bye(2, lost)
        agent.close()
        return 2
    os.environ.update(start.args.get("env") or {})
    if opt.torchrun and len(os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")) == 1 \
            and os.environ.get("CUDA_VISIBLE_DEVICES"):
        os.environ["LOCAL_RANK"] = "0"   # the rank sees only the GPU gmuxd gave it: device 0, whatever torchrun said
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
        if restoring is not None:
            held["restoring"] = False
            carried.extend(s for s in restoring.end() if s not in carried)
        _raise_carried(carried)
    agent.on_first_boundary = first_boundary

    def setup() -> None:
        control.set_default(agent)   # a script that attaches itself (--no-hook) is driven by gmuxd too
        native = os.environ.get("GMUX_NATIVE", "1") != "0"   # GMUX_NATIVE=0: torch's own allocator, state tier
        controller = agent
        if opt.gang and opt.hook:
            # A hooked rank agrees with its peers on the boundary to act at (a script that attaches itself
            # wraps its controller in GangController on its own)
            from gmux.job.gang import GangController
            controller = GangController(agent, lazy=True)
        runner.prepare(controller, hook=opt.hook, native=native, mem_limit=mem_limit, job=job_id,
                       name=opt.name or reg.get("name") or None)
        agent.state = "running"
    held["script"] = True
    if held["handler"] is not None and not held["restoring"] and signal.getsignal(signal.SIGINT) is held["handler"]:
        signal.signal(signal.SIGINT, signal.default_int_handler)   # the script's, as under python (asyncio's own)
    status, reason = runner.run_script(kind, target, script_argv, setup)
    if agent.migrating is not None:
        # The migrate was acknowledged: the state is in the checkpoint, and this process becomes the job's next.
        _reexec(agent, opt, agent.migrating.get("path"), held)
    if held_signals.unrun:
        print(f"gmux-launch: {held_signals.names(held_signals.unrun)} came while gmuxd held job {agent.job}, which "
              f"ends: its script's handler was not run (its state was off the device)", file=sys.stderr, flush=True)
    from gmux.job.api import current   # (torch is imported by now)
    ended = current()
    if ended is not None:
        agent.report(ended.report())    # its last step and figures (reports go out only every few seconds)
    write_exit(rundir, job_id, status, reason, left=launch_signals.left_running(),
               step=ended.profile.steps if ended is not None else None)
    agent.bye(status, reason)
    agent.close()
    return status


def _wait_for_start(agent: Agent):
    """The command that starts the job (None: it was told to exit first). Until then it has no state to suspend,
    checkpoint or move (gmuxd moves a waiting job itself)."""
    while True:
        start = agent.wait()
        if start.kind == "resume":
            return start
        if start.kind == "exit":
            agent.reply(start, {"ok": True, "started": False})
            return None
        agent.reply(start, {"ok": False, "error": f"{start.kind}: the job has not started"})


# The register request's fields as gmux-launch's options spell them: a value the wire format refuses (--gpus 65)
# was said as "register.gpus: 65 is outside [1, 64]", naming a field the user never typed.
_OPTIONS = {"gpus": "--gpus", "gpu": "--gpu", "name": "--name", "mem": "--mem", "weight": "--weight"}


def _in_option_words(error: Exception) -> str:
    field, _, rest = str(error).partition(": ")
    prefix, _, name = field.partition(".")
    ours = isinstance(error, protocol.ProtocolError) and prefix == "register" and name in _OPTIONS
    return f"{_OPTIONS[name]}: {rest}" if ours else str(error)


def _register(rundir: RuntimeDir, opt: LaunchOptions, **fields) -> tuple[Agent, dict]:
    """Registers this process. A job gmuxd accepted (opt.job: one it started, or this job back from a move) does not
    give up while its gmuxd is away, for up to REGISTER_WAIT_S: a restarted gmuxd takes it up, where the job, given
    up, would be reported lost, its script never run. Its request waits for a gmuxd that runs, however busy; once
    the one it went to has ended, it goes again on a new socket (should the old one's still reach a gmuxd, a
    second register of the same job changes nothing). Past the wait it ends with an exit record that says why. A
    cluster job (a lease) gives up at once: its scheduler starts it elsewhere."""
    waits = opt.job is not None and not os.environ.get("GMUX_LEASE_S")
    if waits and not_alone(fields) is None:
        # a gmuxd whose table lost the job takes it back, to start (gmux/node/adoption.py)
        fields["adopt"] = "waiting"
    give_up = time.monotonic() + REGISTER_WAIT_S
    told = False
    while True:
        daemon = rundir.daemon_process()
        agent = Agent(rundir.endpoint, opt.job, opt.token, gone=_ended(daemon) if waits else None)
        try:
            return agent, agent.register(timeout=max(1.0, give_up - time.monotonic()) if waits else 5.0, **fields)
        except DaemonUnavailable as e:
            agent.sock.close(0)
            if not waits:
                raise
            if time.monotonic() >= give_up:
                reason = f"no gmuxd took it up in {REGISTER_WAIT_S:g} s ({e}); its script never ran"
                write_exit(rundir, opt.job, 2, reason)
                raise DaemonUnavailable(reason) from None
            if not told:
                print(f"gmux-launch: {e}; job {opt.job} waits for a gmuxd to take it up", file=sys.stderr, flush=True)
                told = True
            time.sleep(1.0)


def _ended(daemon: Optional[tuple[int, int]]):
    """Why the gmuxd the pid file named cannot answer: it has ended (None while it runs, or is not known)."""
    return lambda: None if daemon is None or alive(*daemon) else f"gmuxd (pid {daemon[0]}) has ended"


def _reexec(agent: Agent, opt: LaunchOptions, path: Optional[str], held: dict) -> None:
    """Becomes a fresh interpreter (same pid) that re-registers and restores from the checkpoint. Until the exec,
    Ctrl-C ends the job in one line (gmux.job.launch_signals), and a signal the script handles is passed on to the new
    process (held_signals), which raises it once restored: here the state may be off the device."""
    held.update(moving=True, kept=path)
    with held_signals.deferred() as (pending, handled), held["while_waiting"]():
        _exec_as_next(agent, opt, path, pending, handled)


def _exec_as_next(agent: Agent, opt: LaunchOptions, path: Optional[str], pending: list, handled: list) -> None:
    agent.close()   # linger lets the migrate result leave first
    # Its children (a persistent_workers loader's workers) would outlive the exec: the pid they watch stays alive.
    for child in multiprocessing.active_children():
        child.terminate()
    for child in multiprocessing.active_children():
        child.join(5)
    # The token travels in the environment, not on the command line that `ps` shows to everyone.
    os.environ["GMUX_JOB_TOKEN"] = agent.token
    cmd = [sys.executable, *interpreter_options(opt.argv), "-m", "gmux.cli.launch", "--runtime-dir", opt.runtime_dir,
           "--job", agent.job,
           "--weight", repr(opt.weight), "--gpus", str(opt.gpus)]
    if opt.mem is not None:
        cmd += ["--mem", f"{opt.mem}B"]
    if not opt.hook:
        cmd += ["--no-hook"]
    if path:
        cmd += ["--restore", path]
    lost = "" if flush_open_files() else (" (what it wrote to a pipe or terminal that was not being read for "
                                          f"{WAIT_S:g} s is lost)")
    # (a line in the job's log between its two processes; a stderr that blocks does not hold the move either)
    within(WAIT_S, lambda: print(f"gmux-launch: job {agent.job} continues in a new process (a fresh interpreter, "
                                 f"pid {os.getpid()} kept)" + (f", from {path}" if path else "") + lost,
                                 file=sys.stderr, flush=True))
    passed = held_signals.unrun + [s for s in pending if s not in held_signals.unrun]
    for name, sigs in ((held_signals.ENV, passed), (held_signals.HANDLED, handled)):
        if sigs:
            os.environ[name] = held_signals.names(sigs)
    os.execv(sys.executable, cmd + ["--", *opt.argv])


def _raise_carried(carried: list) -> None:
    """The signals given to the job while it was held, moved or restored, raised once its state is restored
    here: to the handlers its script installed again, or with their default action (a SIGTERM ends it)."""
    for sig in carried:
        if signal.getsignal(sig) is not signal.SIG_IGN:
            signal.raise_signal(sig)


def _seconds(text: Optional[str]) -> Optional[float]:
    try:
        value = float(text) if text else None
    except ValueError:
        return None
    return value if value is not None and value > 0 else None


def _lease_lost(agent: Agent, rundir: RuntimeDir, waited: float) -> None:
    """A cluster job whose gmuxd has not answered for its lease: the scheduler counts the machine lost by now and
    starts the job elsewhere from its checkpoint. This copy stops where it is (no atexit handler of the script's
    runs: it must not write results over the new copy's), saying why in its exit record."""
    msg = lease_watch.lease_lost_reason(agent.job, waited)
    print(f"gmux-launch: {msg}", file=sys.stderr, flush=True)
    write_exit(rundir, agent.job, protocol.LEASE_LOST_STATUS, msg)
    os._exit(protocol.LEASE_LOST_STATUS)


def _restore_lost(rundir: RuntimeDir, job: Optional[str], path: Optional[str]) -> Optional[str]:
    """Why the checkpoint the job is to restore from (--restore: a move's or a spill's new process) cannot be
    read, said on stderr and, for a job gmuxd knows, in its exit record. Its script is not run: it would start from
    scratch with the job's state lost, in silence where it never reaches a boundary. A cluster start whose
    checkpoint is still on the way (GMUX_RESTORE_WAIT) waits for it in attach() instead."""
    if not path or _arriving():
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)    # (a FIFO must not hold the launch in open())
        try:
            why = None if stat.S_ISREG(os.fstat(fd).st_mode) else "not a regular file"
        finally:
            os.close(fd)
    except OSError as e:
        why = e.strerror or str(e)
    if why is None:
        return None
    msg = (f"cannot restore {'job ' + job if job else 'the job'} from {path}: {why}; its script is not run, "
           f"which would start from scratch")
    print(f"gmux-launch: {msg}", file=sys.stderr, flush=True)
    if job is not None:
        write_exit(rundir, job, 2, msg)
    return msg


def _arriving() -> bool:
    """A checkpoint still on its way to this machine: a cluster start's GMUX_RESTORE_WAIT of more than 0 s."""
    try:
        return restore_wait() > 0
    except ValueError:
        return False    # (attach() says what is wrong with it)


def _check_restored(agent: Agent, rundir: RuntimeDir, path: str) -> None:
    """After a migration the script must have restored its state before its first boundary. If it did not,
    it is training from scratch: stop loudly (the checkpoint stays on disk) rather than lose the work silently."""
    from gmux.job.api import current
    job = current()
    # (a framework job restored from a checkpoint taken at its first boundary has counted one step only)
    if job is not None and (job.profile.steps > 1 or getattr(job, "restored_from", None) == path):
        return
    msg = (f"job {agent.job} was moved with its state in {path}, but the script did not restore it: attach "
           f"its state with gmux.job.attach() (which restores it) before its first step; stopped instead of training "
           f"from scratch (the checkpoint is kept)")
    print(f"gmux-launch: {msg}", file=sys.stderr)
    write_exit(rundir, agent.job, 3, msg)
    agent.bye(3, msg)
    agent.close()
    os._exit(3)
