"""How commands reach a job, and how it answers: the seam between the in-job runtime and whoever drives it.

The runtime decides nothing. At each mini-batch boundary it asks its controller for a pending command
(non-blocking) and carries it out; while suspended it blocks on the controller until told to resume.
`LocalController` drives a job from inside its own process (tests, `python -m gmux.job.run`); the gmuxd
agent drives it over ZeroMQ. Both implement `Controller`.
"""
from __future__ import annotations

import itertools
import queue
import threading
from dataclasses import dataclass, field
from typing import Any, Optional, Protocol

from gmux.protocol import COMMAND_KINDS as COMMANDS  # one list of commands, defined with the wire

# What a job can be told to do. "checkpoint" takes args {"path": str} (or a byte sink, locally);
# "migrate" is checkpoint-then-exit; "spill" (suspended only, {"path": str}) moves the host copy of the
# state to a file; "exit" stops the job at the boundary with its state intact.

_ids = itertools.count(1)


@dataclass
class Command:
    kind: str
    args: dict = field(default_factory=dict)
    id: int = field(default_factory=lambda: next(_ids))
    taken_at: Optional[float] = None    # when the gmuxd agent handed it to the job at a boundary (time.monotonic)

    def __post_init__(self):
        if self.kind not in COMMANDS:
            raise ValueError(f"unknown job command {self.kind!r}; expected one of {', '.join(COMMANDS)}")


class Controller(Protocol):
    def poll(self) -> Optional[Command]:
        """The next pending command, or None. Called at every boundary: must cost microseconds."""

    def wait(self, timeout: Optional[float] = None) -> Optional[Command]:
        """Blocks for the next command (used while suspended). None on timeout."""

    def report(self, report: dict) -> None:
        """Measurements from the job (mini-batch times, memory), sent at most every few seconds."""

    def reply(self, command: Command, result: dict) -> None:
        """The outcome of a command: {"ok": True, ...figures} or {"ok": False, "error": "..."}."""


class LocalController:
    """Commands from threads of the same process; replies and reports are kept for inspection."""

    def __init__(self):
        self._queue: "queue.SimpleQueue[Command]" = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._replies: dict[int, dict] = {}
        self._replied = threading.Condition(self._lock)
        self.reports: list[dict] = []

    def send(self, kind: str, **args: Any) -> Command:
        command = Command(kind, args)
        self._queue.put(command)
        return command

    def poll(self) -> Optional[Command]:
        if self._queue.empty():
            return None
        try:
            return self._queue.get_nowait()
        except queue.Empty:
            return None

    def wait(self, timeout: Optional[float] = None) -> Optional[Command]:
        try:
            return self._queue.get(timeout=timeout)
        except queue.Empty:
            return None

    def report(self, report: dict) -> None:
        with self._lock:
            self.reports.append(report)

    def reply(self, command: Command, result: dict) -> None:
        with self._replied:
            self._replies[command.id] = result
            self._replied.notify_all()

    def result(self, command: Command, timeout: Optional[float] = None) -> dict:
        """Waits for the job's reply to `command`."""
        with self._replied:
            if not self._replied.wait_for(lambda: command.id in self._replies, timeout):
                raise TimeoutError(f"job did not answer {command.kind} (id {command.id}) within {timeout} s")
            return self._replies.pop(command.id)


# The controller a launcher (gmux-launch) installs before the user's script runs, so that `attach()` and the
# transparent hook in that process talk to gmuxd without the script naming a controller.
_default: Optional[Controller] = None


def set_default(controller: Optional[Controller]) -> None:
    global _default
    _default = controller


def default() -> Optional[Controller]:
    return _default
