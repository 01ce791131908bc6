"""The job's side of gmuxd: a `Controller` (see control.py) that talks to the daemon over a ZeroMQ DEALER.

Single-threaded on purpose: the runtime calls `poll()` at every mini-batch boundary from the training thread,
and a non-blocking zmq poll costs about 2 µs, so no helper thread (which would contend for the GIL during
training) is needed. While suspended the runtime blocks in `wait()`, which sends a heartbeat every second so
a restarted daemon learns where the job is. Every message carries the job's id and token (a job can only act
on itself) and the agent's view of its state (running / suspended / waiting), which lets a restarted daemon
reconcile what it believed with what is true. A job suspended in place (for a move: gmux.job.job) still holds
its GPU memory, so it says "running": that memory is what a restarted daemon must count.

Sends never block training: if the daemon is gone, messages queue in zmq (up to its high-water mark) and are
delivered when it comes back; beyond that they are dropped, and the next report supersedes them.
"""
from __future__ import annotations

import contextlib
import os
import sys
import time
from collections import deque
from typing import Any, Callable, Optional

import zmq

from gmux import protocol
from gmux.job.control import Command
from gmux.util.text import digits
from gmux.wire.daemon_client import unavailable_message
from gmux.wire.request import Requester

SAMPLE_S = 0.2     # how often a running job tells gmuxd how many boundaries it has passed


class DaemonUnavailable(ConnectionError):
    """gmuxd did not answer; the message says how to start it."""


def _refused(mtype: str, error: str) -> str:
    # (gmuxd's refusals start with the request's type, its wire checks with "type.field": said once)
    for said in (f"{mtype}: ", f"{mtype}."):
        error = error.removeprefix(said)
    return f"gmuxd refused {mtype}: {error}"


class Agent:
    def __init__(self, endpoint: str, job: Optional[str] = None, token: Optional[str] = None,
                 context: Optional[zmq.Context] = None, gone: Optional[Callable[[], Optional[str]]] = None):
        """gone: why gmuxd can no longer answer a request (gmux.wire.request.Requester), asked while one waits."""
        self.endpoint = endpoint
        self.job = job
        self.token = token
        self.sock = (context or zmq.Context.instance()).socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 2000)   # a final result/bye gets 2 s to leave when the process exits
        self.sock.setsockopt(zmq.SNDHWM, 1000)
        self.sock.connect(endpoint)
        self.requests = Requester(self.sock, "gmuxd", RuntimeError,
                                  lambda waited: unavailable_message(endpoint, waited), on_message=self._dispatch,
                                  on_bad=self._bad, unanswered=DaemonUnavailable, refused=_refused, gone=gone)
        self._commands: deque[Command] = deque()
        self.state = "waiting"           # running / suspended / waiting (not started yet)
        self.in_place = False            # suspended in place: waiting at a boundary, its memory where it was
        self.migrating: Optional[dict] = None   # args of an acknowledged migrate: the process must re-exec
        self.errors: list[str] = []      # error replies from the daemon to one-way messages (kept for tests/logs)
        self._last_sent = 0.0
        self.boundaries = 0
        self._next_sample = 0.0
        self.on_first_boundary = None   # a launcher's check, run once at the first boundary
        self.while_waiting = contextlib.nullcontext   # around each wait for gmuxd's word (a launcher's Ctrl-C)
        # A cluster job's lease: once gmuxd has answered nothing for lease_s, on_lease_lost(seconds) is called at
        # a boundary (or while waiting), since the scheduler then starts the job elsewhere.
        self.lease_s: Optional[float] = None
        self.on_lease_lost = None
        self._unanswered_since: Optional[float] = None   # the first message sent since gmuxd last said anything
        # What this job registered with, the GPU it was last resumed on, and whether gmuxd said it does not know
        # the job (a restarted gmuxd whose table was lost): the job registers again to be adopted (adoption.py).
        self._registration: dict = {}
        self.gpu: Optional[int] = None
        self._unknown = False
        self._not_adopted: Optional[str] = None

    # --- request/reply (registration): blocks, queueing any command that arrives meanwhile ---
    def request(self, mtype: str, timeout: float = 5.0, **fields: Any) -> Any:
        out = self.requests.call(mtype, timeout, **fields)
        self._unanswered_since = None
        return out

    def register(self, timeout: float = 5.0, **fields: Any) -> dict:
        self._registration = {k: v for k, v in fields.items() if k not in ("job", "token", "adopt", "on_gpu")}
        if self.job and self.token:
            fields.update(job=self.job, token=self.token)
        data = self.request("register", timeout, **fields)
        self.job, self.token = data["job"], data["token"]
        # (what gmuxd admitted it with: a submitted job's --mem, name and weight are not on its command line)
        self._registration.update({k: data[k] for k in ("mem", "name", "weight") if data.get(k)})
        return data

    def _adopt(self) -> None:
        """gmuxd does not know this job: register again, as what it is and where it runs, to be taken back. A
        cluster job is not (its scheduler starts it elsewhere once its lease ends); a refusal is final."""
        self._unknown = False
        if self.lease_s or not self._registration or self._not_adopted is not None:
            return
        alone = not_alone(self._registration)
        if alone:
            self._not_adopted = alone
            print(f"gmux: gmuxd no longer knows job {self.job}, and {alone}: it runs on, unsupervised",
                  file=sys.stderr, flush=True)
            return
        try:
            self.request("register", 5.0, **self._registration, job=self.job, token=self.token, adopt=self.state,
                         on_gpu=self.gpu)
        except DaemonUnavailable:
            return      # asked again at the next "unknown"
        except RuntimeError as e:
            self._not_adopted = str(e)
            if self.state == "waiting":     # never started: nothing would ever start it
                raise DaemonUnavailable(f"gmuxd no longer knows job {self.job} and did not take it back ({e}); "
                                        f"it never started") from None
            print(f"gmux: gmuxd no longer knows job {self.job} and did not take it back ({e}); it runs on, "
                  f"unsupervised", file=sys.stderr, flush=True)

    # --- the Controller protocol ---
    def poll(self) -> Optional[Command]:
        # poll() is called once per mini-batch boundary: counting calls gives gmuxd the job's rate at a finer
        # grain than the runtime's 1 s reports (a quantum of 1-2 s needs several samples).
        self.boundaries += 1
        at = time.monotonic()
        if self.on_first_boundary is not None:
            check, self.on_first_boundary = self.on_first_boundary, None
            check()
        if not self._commands and self.sock.poll(0):
            self._drain()
        if self._unknown:
            self._adopt()
        self._check_lease(at)
        if self._commands:
            # A command goes first: its sender waits for the result, and encoding and sending a sample first
            # cost ~0.2 ms (up to 5 ms on a busy machine). The sample waits for the next boundary (gmuxd drops
            # one taken while a suspend or migrate is in flight anyway).
            command = self._commands.popleft()
            command.taken_at = at     # gmuxd splits the command's latency at this boundary
            return command
        if at >= self._next_sample:
            self._next_sample = at + SAMPLE_S
            self._send("heartbeat", state=self.state, boundaries=self.boundaries, t=time.time())
        return None

    def while_held(self):
        """Around the span a suspend holds the job (gmux.job.job): Ctrl-C there is the launcher's, as in a wait."""
        return self.while_waiting()

    def wait(self, timeout: Optional[float] = None) -> Optional[Command]:
        if self.state == "running" and not self.in_place:
            self.state = "suspended"
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.while_waiting():
            while not self._commands:
                now = time.monotonic()
                if now - self._last_sent >= protocol.HEARTBEAT_S:
                    self._send("heartbeat", state=self.state)
                left = protocol.HEARTBEAT_S if deadline is None else min(protocol.HEARTBEAT_S, deadline - now)
                if left <= 0:
                    return None
                if self.sock.poll(left * 1000):
                    self._drain()
                if self._unknown:
                    self._adopt()
                self._check_lease(time.monotonic())
        return self._commands.popleft()

    def report(self, report: dict) -> None:
        # The agent's boundary count travels with every message: with the runtime's step from a report it
        # gives gmuxd the job's exact step at each heartbeat and at each acknowledgement, not once a second.
        self._send("report", report=_plain(report), state=self.state, boundaries=self.boundaries)

    def reply(self, command: Command, result: dict) -> None:
        ok = bool(result.get("ok"))
        if ok:
            if command.kind in ("resume", "suspend"):
                self.in_place = command.kind == "suspend" and bool(result.get("in_place"))
                self.state = "running" if command.kind == "resume" or self.in_place else "suspended"
            elif command.kind == "migrate":
                self.migrating = dict(command.args)
        taken = {} if command.taken_at is None else {"taken_at": command.taken_at}
        self._send("result", cmd=command.id, kind=command.kind, result=_plain(result), boundaries=self.boundaries,
                   state=self.state, **taken)

    def bye(self, status: int, reason: str = "") -> None:
        self._send("bye", status=int(status), reason=reason[:1000])

    def close(self) -> None:
        self.sock.close()

    # --- internals ---
    def _send(self, mtype: str, **fields: Any) -> None:
        if self.job is None:
            return  # not registered (a script run outside gmux-launch): nobody to tell
        try:
            self.requests.send(mtype, job=self.job, token=self.token, **fields)
            self._last_sent = time.monotonic()
            if self._unanswered_since is None:
                self._unanswered_since = self._last_sent
        except zmq.Again:
            pass  # daemon unreachable and queue full: the next report supersedes this one

    def _drain(self) -> None:
        while self.sock.poll(0):
            msg = self.requests.receive()
            if msg is not None:
                self._dispatch(msg)

    def _bad(self, e: protocol.ProtocolError) -> None:
        self.errors.append(f"bad message from gmuxd: {e}")

    def _check_lease(self, now: float) -> None:
        def over() -> bool:
            since = self._unanswered_since
            return since is not None and now - since > self.lease_s
        if not (self.lease_s and self.on_lease_lost is not None and over()):
            return
        if self.sock.poll(0):
            self._drain()       # an answer may be waiting, unread (the process was stopped, or busy with commands)
        if over():
            self.on_lease_lost(now - self._unanswered_since)

    def _dispatch(self, msg: protocol.Message) -> None:
        self._unanswered_since = None     # gmuxd answers every message (one-way ones with an empty reply)
        if msg.type == "command":
            if msg["kind"] == "resume":
                self.gpu = msg["args"].get("gpu", self.gpu)
            self._commands.append(Command(msg["kind"], dict(msg["args"]), id=msg["cmd"]))
        elif msg.type == "reply":   # to a one-way message nobody waits for
            self._unknown = self._unknown or bool(msg.get("unknown"))
            if not msg.get("ok") and len(self.errors) < 100:
                self.errors.append(str(msg.get("error")))


def not_alone(registration: dict) -> Optional[str]:
    """Why a job cannot be taken back on its own (None: it can): a gang rank or a job of several GPUs, whose
    peers and GPUs gmuxd would not know. A submitted one says so only in its environment."""
    world = os.environ.get("WORLD_SIZE", "1")
    if registration.get("gang") or (digits(world) and int(world) > 1):
        return "a gang rank cannot be taken back"
    if registration.get("gpus", 1) > 1 or any("," in os.environ.get(v, "")
                                                for v in ("CUDA_VISIBLE_DEVICES", "GMUX_VIRTUAL_GPU")):
        return "a job of several GPUs cannot be taken back"
    return None


def _plain(d: dict) -> dict:
    """Only msgpack-able values (figures from the runtime may hold numpy/torch scalars)."""
    out = {}
    for k, v in d.items():
        if isinstance(v, (str, int, float, bool)) or v is None:
            out[str(k)] = v
        elif isinstance(v, dict):
            out[str(k)] = _plain(v)
        elif isinstance(v, (list, tuple)):
            out[str(k)] = [x if isinstance(x, (str, int, float, bool)) or x is None else str(x) for x in v][:64]
        elif hasattr(v, "item"):
            try:
                out[str(k)] = v.item()
            except Exception:
                out[str(k)] = str(v)
        else:
            out[str(k)] = str(v)
    return out
