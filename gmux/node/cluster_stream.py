"""A move's checkpoint streamed from the job to the target machine, never staged in a file (issue 15, item 1);
and the staged way, for checkpoints that are files.

The link makes the checkpoint's path a pipe (a FIFO in its own runtime directory), has gmuxd tell the suspended
job to checkpoint there, and sends what comes out of the pipe as it comes (gmux.wire.transfer.send_stream):
the job, suspended in place (its memory where it was, nothing copied out), splices its live state into the pipe
(gmux.job.job, gmux.util.splice: no file, no fsync, no copy; the link's read is the only one), the link encrypts
and sends it, the target appends it, all at once. Before the old way's 1 GiB staged move paid a file write with
fsync, then file reads, then the transfer, one after the other.

The end of the stream is not its end: the target's file is completed (xfer_end) only once gmuxd has said that
the job wrote its whole checkpoint. A job that fails or dies half-way leaves a stream that just stops: the
sender waits for that word, hears a failure, never completes the file, and the move fails with the job where
it was (suspended at its source, resumed by the link). A transfer that fails closes the pipe's reading end:
the job's next write fails (EPIPE), its checkpoint fails, and the same happens.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import os
import stat
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Optional

from gmux.wire.daemon_client import GmuxBusy, GmuxError
from gmux.wire.transfer import CHUNK, TransferError, rank_xfers, send_file, send_stream

PIPE_BYTES = 1 << 20


def patiently(ask: Callable[[], Optional[GmuxError]], patience: float = 120.0) -> Optional[str]:
    """gmuxd's answer to `ask` (its refusal or None) as an error text or None, asked again while gmuxd refuses
    only for now (GmuxBusy: the job is still busy with the move's suspend): a job that missed its suspend
    deadline is stopped and reaches its boundary only at a later turn (gmux.node.pacing), and gmuxd acknowledges
    the suspend before that."""
    deadline = time.monotonic() + patience
    while True:
        error = ask()
        if not isinstance(error, GmuxBusy) or time.monotonic() > deadline:
            return None if error is None else str(error)
        time.sleep(0.2)


def staged(path: str, ask: Callable[[], Optional[GmuxError]]) -> Optional[str]:
    """A checkpoint written as a file at `path` (`ask`: gmuxd's checkpoint command, patiently). A pipe left
    there by a stream its link never finished (it was killed mid-move) goes first: the job would take it for
    a stream and wait for a reader that never comes."""
    with contextlib.suppress(FileNotFoundError):
        if stat.S_ISFIFO(os.lstat(path).st_mode):
            os.unlink(path)
    return patiently(ask)


def send_files(paths: list, endpoint: str, server_key: bytes, xfer: str, sender: dict) -> tuple[list, dict]:
    """The staged way, where a checkpoint is a file (a periodic one, sent to gmux-scheduler): a file per
    rank sent as XFER.RANK, each deleted once the receiver holds it; (the transfer names, figures)."""
    names, total = rank_xfers(xfer, len(paths)), {"bytes": 0, "sealed_bytes": 0, "seconds": 0.0}
    for path, name in zip(paths, names):
        r = send_file(path, endpoint, server_key, xfer=name, **sender)
        os.unlink(path)
        for k in total:
            total[k] += r[k]
    return names, total


def stream_ranks(ranks: list, endpoint: str, server_key: bytes, xfer: str, path_of: Callable[[str], str],
                 checkpoint: Callable[[str], Optional[GmuxError]], sender: dict,
                 stop: Optional[threading.Event] = None) -> tuple[list, dict]:
    """Every rank's checkpoint (gmuxd job ids `ranks`) streamed to `endpoint` as XFER.RANK, all at once:
    `path_of(rank)` is where gmuxd has the job write it, `checkpoint(rank)` asks for it (gmuxd's refusal or
    None), `sender` is send_stream's identity (keydir, role, name, context), `stop` gives the sends up once
    set. Returns (the transfer names, figures: bytes, seconds of the slowest, checkpoint_s until the last job had
    written its own)."""
    names = rank_xfers(xfer, len(ranks))
    t0 = time.perf_counter()
    written: list = []

    def one(rank: str, name: str) -> dict:
        def ask() -> Optional[str]:
            error = patiently(lambda: checkpoint(rank))
            written.append(time.perf_counter() - t0)
            return error
        send = functools.partial(send_stream, endpoint=endpoint, server_key=server_key, xfer=name, stop=stop,
                                 **sender)
        return stream_out(path_of(rank), ask, send)

    with ThreadPoolExecutor(len(ranks), thread_name_prefix="rank-stream") as ex:
        figures = list(ex.map(one, ranks, names))
    return names, {"bytes": sum(f["bytes"] for f in figures), "sealed_bytes": sum(f["sealed_bytes"] for f in figures),
                   "seconds": max(f["seconds"] for f in figures),
                   "checkpoint_s": max(written)}


def stream_out(path: str, checkpoint: Callable[[], Optional[str]],
               send: Callable[..., dict]) -> dict:
    """Makes `path` a pipe; `checkpoint()` has the job write into it and returns an error text or None, while
    `send(read, before_end=...)` streams what comes out (transfer.send_stream, its other arguments bound).
    Returns send's figures, or raises (TransferError, or RuntimeError with the checkpoint's error)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)                     # a staged file or a pipe left by a link that stopped
    os.mkfifo(path, 0o600)
    written = threading.Event()
    verdict: dict = {}
    outcome: dict = {}

    def before_end() -> None:
        written.wait()
        if verdict.get("error") is not None:
            raise TransferError(f"the job's checkpoint failed: {verdict['error']}")

    def failed(e: BaseException) -> None:
        outcome.setdefault("error", e)
        outcome.setdefault("at", time.monotonic())

    def pump() -> None:
        try:
            fd = os.open(path, os.O_RDONLY)   # until the job opens its end (or _unblock, below)
            with contextlib.suppress(OSError):  # 1 MiB, not 64 KiB: a sixteenth of the wake-ups (capped by
                fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, PIPE_BYTES)          # /proc/sys/fs/pipe-max-size)
            with open(fd, "rb", buffering=CHUNK) as pipe:
                try:
                    outcome["figures"] = send(pipe.read, before_end=before_end)
                except BaseException as e:  # noqa: B902 - stamped before the pipe closes (the job's EPIPE)
                    failed(e)
        except BaseException as e:          # noqa: B902 - handed to the caller, whatever it is
            failed(e)

    t = threading.Thread(target=pump, name="checkpoint-stream", daemon=True)
    t.start()
    try:
        verdict["error"] = checkpoint()
    except BaseException as e:              # noqa: B902
        verdict["error"] = f"{type(e).__name__}: {e}"
        raise
    finally:
        verdict["at"] = time.monotonic()
        written.set()
        _unblock(path, t)                   # the pump may wait in open() for a job that never opened the pipe
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    # Whichever failed first is the cause: a transfer that gave up (the job then saw EPIPE), or the job (the
    # stream then stopped, or never began).
    if "error" in outcome and (verdict["error"] is None or outcome["at"] < verdict["at"]):
        raise outcome["error"]
    if verdict["error"] is not None:
        raise RuntimeError(verdict["error"])
    return outcome["figures"]


def _unblock(path: str, pump: threading.Thread) -> None:
    """Waits for the pump to end. Should the job never have opened the pipe (its checkpoint refused, or written
    elsewhere), opens and closes its writing end, so that the pump, waiting in open(), reads an empty stream and
    stops; a pump already reading sees one more writer come and go, nothing else."""
    while pump.is_alive():
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        except OSError as e:
            if e.errno not in (errno.ENXIO, errno.ENOENT):   # ENXIO: the pump has not opened its end yet
                raise
        pump.join(0.05)
        time.sleep(0.01)
