"""Gang commands for multi-rank (torch.distributed) jobs: every rank carries out a command at the same boundary.

Each rank of an N-rank job is its own gmux job with its own controller (its gmuxd agent), so the ranks' suspend
commands arrive at different boundaries. A rank that suspended alone would leave its peers blocked inside the
next collective, holding their GPUs; a rank that checkpointed alone would write a state its peers do not share.
`GangController` wraps a rank's controller: at every boundary it holds back what arrived and asks the gang, with
one tiny all_reduce(MIN) on a process group of the job's own, which kinds of command every rank now holds; one of
them is handed to the runtime, so all ranks act on the same step. `resume` needs no agreement: each rank resumes
when told, and the ranks meet again in their next collective.

Agreement is per kind, and a rank holds only the latest command of each kind. A rank can hold a command its peers
never get (gmuxd refused a peer's, or its requester gave up on it): compared first-come first-served, that
command stood before every later one on that rank, the ranks never again held the same kind first, and the gang
could not be suspended or checkpointed for the rest of its run. Held per kind, such a command waits only for its
own kind, and a newer one of that kind takes its place (gmuxd answers every request waiting on a job's kind with
the job's one acknowledgement of it). When the gang holds several kinds, they go in the order of `_AGREE`, each
leaving the next answerable: a suspended job still checkpoints, moves and exits; one that exited does nothing.

NCCL communicators across a suspend (what this means on GPUs): the ranks suspend between steps, after the step's
collectives have completed, so no collective is in flight and the process group stays valid; its communicators
are not destroyed. Their own device memory (NCCL's channel buffers, allocated by NCCL outside torch's caching
allocator and outside gmux's allocator tier) stays allocated while the job is suspended: a suspended NCCL gang
does not give that memory back (gloo's buffers are host memory). A gang moved to other machines cannot take
its communicators along: the new processes restore from the checkpoint and build a new process group.

A cluster job's lease (gmux.job.launch: each rank stops itself once its gmuxd has not answered for that long) is
agreed the same way, but by any rank rather than all: a rank that stopped alone, at its own boundary, left its
peers waiting in the next collective until its timeout (gloo's and NCCL's default: 30 minutes). The ranks share
one gmuxd, so once one has lost it, all stop at the same boundary.

The cost is one all_reduce of five ints per boundary (tens of µs with gloo on one machine).

A transparent-mode rank (a torchrun worker under gmux-launch) is wrapped before its script has made the default
process group, so its own group is made at its first boundary after `init_process_group` (`lazy`): every rank
gets there at the same step of the same program, so the ranks make it in the same order relative to the script's
own groups. Until then a command that needs agreement is held.
"""
from __future__ import annotations

import contextlib
from collections import deque
from typing import Optional

import torch
import torch.distributed as dist

from gmux.job.control import Command, Controller

_AGREE = ("checkpoint", "suspend", "migrate", "exit")


class GangController:
    def __init__(self, inner: Controller, group=None, lazy: bool = False):
        self.inner = inner
        self.group = group if group is not None or lazy else dist.new_group(backend="gloo")
        self.held: dict[str, Command] = {}             # kind -> the latest command of it not carried out
        self.boundaries = 0
        self.agreed_at: list[tuple[str, int]] = []     # (kind, boundary) of every command carried out as a gang
        self._lost: list[float] = []                   # this rank's lease lost at this boundary: seconds silent
        # Commands needing no agreement, handed on after this boundary's agreement: every rank takes part in
        # every round, or the rounds pair up across boundaries and the ranks act at different steps.
        self.alone: deque[Command] = deque()

    def poll(self) -> Optional[Command]:
        self.boundaries += 1
        lease_lost = getattr(self.inner, "on_lease_lost", None)
        if lease_lost is not None and (self.group is not None or (dist.is_available() and dist.is_initialized())):
            self.inner.on_lease_lost = self._lost.append     # (acted on by the whole gang below)
        try:
            c = self.inner.poll()  # every boundary, even while holding one: the agent counts boundaries
        finally:
            if lease_lost is not None:
                self.inner.on_lease_lost = lease_lost
        if c is not None:
            if c.kind in _AGREE:
                self.held[c.kind] = c
            else:
                self.alone.append(c)      # e.g. a stray resume: the runtime answers it as it would alone
        if self.group is None:
            if not (dist.is_available() and dist.is_initialized()):
                return self._alone()      # no process group yet: nothing to agree through
            self.group = dist.new_group(backend="gloo")
        silent_ms = int(max(self._lost) * 1000) + 1 if self._lost else 0
        self._lost.clear()
        flags = torch.tensor([int(k in self.held) for k in _AGREE] + [-silent_ms], dtype=torch.int64)
        dist.all_reduce(flags, op=dist.ReduceOp.MIN, group=self.group)
        if int(flags[-1]) < 0 and lease_lost is not None:
            lease_lost(-int(flags[-1]) / 1000)   # some rank's lease is lost: every rank stops here
        # (every rank reads the same flags, so all take the same kind)
        agreed = next((k for k, every in zip(_AGREE, flags.tolist()) if every), None)
        if agreed is None:
            return self._alone()
        cmd = self.held.pop(agreed)
        self.agreed_at.append((cmd.kind, self.boundaries))
        return cmd

    def _alone(self) -> Optional[Command]:
        return self.alone.popleft() if self.alone else None

    def wait(self, timeout: Optional[float] = None) -> Optional[Command]:
        return self._alone() or self.inner.wait(timeout)

    def while_held(self):
        return getattr(self.inner, "while_held", contextlib.nullcontext)()

    def report(self, report: dict) -> None:
        self.inner.report(report)

    def reply(self, command: Command, result: dict) -> None:
        self.inner.reply(command, result)
