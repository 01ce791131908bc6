"""Helpers shared by the runtime tests (a plain module: each test folder has its own conftest)."""
import contextlib
import math
import os
import signal
import subprocess
import sys
import tempfile
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The training script the gmuxd and cluster tests run (plain torch; --attach for explicit mode).
TRAIN = os.path.join(ROOT, "gmux", "examples", "demo_train.py")
PY = sys.executable


def fuzz_examples(default: int) -> int:
    """A fuzz test's number of examples: `default` in the suite, GMUX_FUZZ_EXAMPLES for a longer run."""
    return int(os.environ.get("GMUX_FUZZ_EXAMPLES") or default)


def paced(tmp_path, sleep: str, name: str = "unpaced") -> list:
    """A training script's pacing, SLEEP seconds of "input" per mini-batch, until unpace(tmp_path, name): a test
    that has seen what the pacing was there for (slices, a window, a move mid-run) lets its jobs and their
    references run the rest at full speed, which changes none of their numbers."""
    return ["--sleep", sleep, "--unpaced-when", os.path.join(str(tmp_path), name)]


def unpace(tmp_path, name: str = "unpaced") -> None:
    open(os.path.join(str(tmp_path), name), "a").close()


def env() -> dict:
    """The environment for a process of the project under test."""
    e = dict(os.environ)
    e["PYTHONPATH"] = ROOT + os.pathsep + e.get("PYTHONPATH", "")
    e.setdefault("OMP_NUM_THREADS", "1")
    e.pop("COLUMNS", None)      # (piped `gmux ps` is laid out for COLUMNS where set: tests read it at 160)
    return e


_server = None        # the fork server of this pytest worker (forkserver.py); False once it failed to start


def start_py(*args, env_=None, cwd=ROOT, log=None, err=None):
    """`python ARGS` as a new process (the subprocess.Popen methods the tests use): forked from a warm
    interpreter where the environment allows, else started cold. log: a path for its output (stdout, and
    stderr unless err names another); without one its output is dropped and its errors go to this worker's
    stderr."""
    return _start(list(args), env() if env_ is None else env_, cwd, log or os.devnull, err or log)


def _start(args: list, environ: dict, cwd: str, stdout: str, stderr: str | None):
    global _server
    if _server is None:
        try:
            import forkserver
            _server = forkserver.Server(PY, env(), ROOT)
        except Exception as e:          # the suite is slower without it, never wrong
            print(f"fork server unavailable, starting cold: {e}", file=sys.stderr)
            _server = False
    if _server and _server.fits(environ):
        return _server.spawn(args, environ, cwd, stdout, stderr)
    with open(stdout, "ab") as out, open(stderr or os.devnull, "ab") as err:
        return subprocess.Popen([PY, *args], env=environ, cwd=cwd, stdout=out,
                                stderr=None if not stderr else subprocess.STDOUT if stderr == stdout else err)


def run_py(*args, timeout=180, check=True):
    """Runs python with the project importable, in a new process; returns the completed process."""
    with tempfile.TemporaryDirectory() as d:
        out, err = os.path.join(d, "out"), os.path.join(d, "err")
        proc = _start(list(args), env(), ROOT, out, err)
        try:
            code = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
        if not os.path.exists(out):
            raise AssertionError(f"{args}: its process ended ({code}) before it opened its output")
        with open(out, errors="replace") as f, open(err, errors="replace") as g:
            done = subprocess.CompletedProcess([PY, *args], code, f.read(), g.read())
    if check and code != 0:
        raise AssertionError(f"{args} exited {code}\n{done.stdout}\n{done.stderr}")
    return done


def run_ranks(script: str, world: int, tmp_path, args_of, timeout: float = 60) -> tuple[list, str]:
    """The ranks of a gang, `python SCRIPT *args_of(rank)` each, run to their end: (exit codes, None for one still
    running at `timeout`, then killed; every rank's output, for an assertion's message)."""
    ranks = [start_py(script, *args_of(r), log=str(tmp_path / f"r{r}")) for r in range(world)]
    try:
        codes = [p.wait(timeout=timeout) for p in ranks]
    except subprocess.TimeoutExpired:
        codes = [p.poll() for p in ranks]
    finally:
        for p in ranks:
            if p.poll() is None:
                p.kill()
    return codes, "\n".join(f"rank {r}:\n" + (tmp_path / f"r{r}").read_text() for r in range(world))


def assert_identical(a, b, where="state"):
    """Bit-for-bit equality of nested tensors, numbers and containers, naming the first difference. A sparse COO
    tensor's indices and values are compared in their order, with its coalesced flag."""
    if isinstance(a, torch.Tensor) and a.layout == torch.sparse_coo:
        assert isinstance(b, torch.Tensor) and b.layout == a.layout and a.dtype == b.dtype and a.shape == b.shape, where
        assert a.is_coalesced() == b.is_coalesced(), f"{where}: coalesced {a.is_coalesced()} != {b.is_coalesced()}"
        assert_identical(a._indices(), b._indices(), f"{where} indices")
        assert_identical(a._values(), b._values(), f"{where} values")
    elif isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape, where
        assert torch.equal(a.view(torch.uint8) if a.dim() else a, b.view(torch.uint8) if b.dim() else b), \
            f"{where} differs"
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), f"{where}: keys {set(a) ^ set(b)}"
        for k in a:
            assert_identical(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), f"{where}: length {len(a)} != {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            assert_identical(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def proc_state(pid: int) -> str:
    """The process's state letter (T: stopped, Z: a zombie); '' once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return ""


def fill_db(db) -> None:
    """The SQLite database full, as on a full disk (SQLITE_FULL at its next new page), without a small
    filesystem."""
    pages = db.execute("PRAGMA page_count").fetchone()[0]
    db.execute(f"PRAGMA max_page_count={pages}")


@contextlib.contextmanager
def full_filesystem(path, size: str = "1m"):
    """A small tmpfs mounted at `path` (a directory) and filled to its last byte, unmounted after; the test is
    skipped where mounting is not permitted (not root)."""
    import pytest
    if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)],
                      capture_output=True).returncode:
        pytest.skip("needs a small filesystem of its own: mounting a tmpfs is not permitted here (not root)")
    try:
        fd = os.open(os.path.join(path, "filler"), os.O_WRONLY | os.O_CREAT)
        try:
            while True:
                os.write(fd, b"\0" * 4096)
        except OSError:
            os.close(fd)
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)])


# argv of a job whose row needs new pages of a database (gmux_testkit.fill_db)
BIG_ARGV = ["python", "train.py"] + ["--x=" + "y" * 1000] * 40


def wait_for(pred, timeout: float, what, every: float = 0.2):
    """Polls `pred` until it returns something true (returned), or fails the test naming `what` (a text, or
    a function giving one: the state at the time of failure)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout} s: {what() if callable(what) else what}")


def jobs_under(directory) -> list:
    """(pid, command line) of every job process (gmux-launch, or a warm interpreter) whose command line names
    `directory` (/proc, not ps: ps cuts a command line at 80 columns when its output is not a terminal)."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                args = f.read().decode(errors="replace")
        except OSError:
            continue
        if str(directory) in args and ("gmux.cli.launch" in args or "gmux.cli.warm" in args):
            found.append((int(pid), args))
    return found


def kill_jobs_under(directory) -> None:
    """SIGKILLs every job process under `directory` (jobs_under)."""
    for pid, _ in jobs_under(directory):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


class OwnCosine:
    """An LR scheduler that is not torch's, as timm's are: it marks the groups it drives with "initial_lr" and
    keeps its state in its attributes, which state_dict() gives and load_state_dict() takes."""

    def __init__(self, optimizer, t_initial=6, warmup=(2, 0.01)):
        self.optimizer, self.t_initial, self.warmup, self.epoch = optimizer, t_initial, list(warmup), 0
        for group in optimizer.param_groups:
            group.setdefault("initial_lr", group["lr"])
        self.base_values = [group["initial_lr"] for group in optimizer.param_groups]

    def step(self, epoch=None):
        self.epoch = self.epoch + 1 if epoch is None else epoch
        for group, base in zip(self.optimizer.param_groups, self.base_values):
            steps, start = self.warmup
            t = self.epoch % self.t_initial
            group["lr"] = start + (base - start) * self.epoch / steps if self.epoch < steps else \
                base * 0.5 * (1 + math.cos(math.pi * t / self.t_initial))

    def get_last_lr(self):          # (what a Hugging Face Trainer logs)
        return [group["lr"] for group in self.optimizer.param_groups]

    def state_dict(self):
        return {k: v for k, v in self.__dict__.items() if k != "optimizer"}

    def load_state_dict(self, state):
        self.__dict__.update(state)
