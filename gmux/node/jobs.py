"""The daemon's record of one job: who it is, where it runs, its state, and what it measured.

A Job is plain data plus the arithmetic on its reports (mini-batch rate over a residency window). The
daemon mutates it; the store persists it; the policies read `JobView`s derived from it.
"""
from __future__ import annotations

import itertools
import time
from dataclasses import asdict, dataclass, field
from typing import Optional

# Persisted columns (everything else is measurement, persisted as a JSON blob).
IDENTITY = ("id", "token", "name", "argv", "cwd", "pid", "starttime", "gpu", "weight", "mem", "state",
            "managed", "created", "detail", "exit_status")
TRANSIENT = ("identity", "outbox", "kill_requested", "kill_reason", "_window", "_solo_now", "_solo_hist",
             "_step_offset", "registered", "_late_told", "_note")


@dataclass
class Job:
    id: str
    token: str
    name: str
    argv: list
    cwd: str = ""
    pid: int = 0
    starttime: Optional[int] = None
    gpu: Optional[int] = None
    weight: float = 1.0
    mem: Optional[int] = None          # declared working set (bytes); None: use the measured peak
    state: str = "waiting"
    managed: bool = False              # spawned by gmuxd (gmux submit) rather than by gmux-launch
    created: float = field(default_factory=time.time)
    detail: str = ""                   # what happened, in words (shown by gmux ps)
    exit_status: Optional[int] = None
    ended: Optional[float] = None      # wall time it ended (its row is pruned `retain_ended` after)
    env: dict = field(default_factory=dict)  # extra environment of a submitted job
    uid: Optional[int] = None          # its owner (who submitted or registered it; a system daemon runs it as them)
    gid: Optional[int] = None          # ... and the owner's group as the kernel gave it
    hook: bool = True                  # a submitted job runs with the transparent optimizer hook (False: it
                                       # calls gmux.job.attach() itself, as gmux-launch --no-hook)
    gpus_wanted: int = 1               # GPUs the process uses; more than one are given to it exclusively
    gang: Optional[dict] = None        # {id, rank, size}: one rank of a torch.distributed job
    pinned: Optional[int] = None       # the GPU the job was asked to run on (gmux-launch --gpu)
    exclusive_gpus: list = field(default_factory=list)  # GPUs held exclusively (multi-GPU job, gang rank)
    parked_gpus: list = field(default_factory=list)     # ... given back while suspended by the user: it resumes
                                                        # on these (its process's devices), once they are free
    # --- measurements (from the job's reports and the daemon's own clock) ---
    step: int = 0
    mem_boundary: Optional[int] = None
    mem_peak: Optional[int] = None
    rate_now: Optional[float] = None   # mini-batches/s over the current residency
    rate_solo: Optional[float] = None  # measured while running alone on its GPU
    gpu_seconds: float = 0.0           # wall time resident on its GPU
    suspends: int = 0
    suspend_seconds: float = 0.0       # time spent carrying out suspend+resume commands (their cost)
    host_bytes: int = 0                # host RAM holding its suspended state
    migrations: int = 0
    boundaries: int = 0                # mini-batch boundaries its current process has passed
    stops: int = 0                     # times gmuxd stopped it (SIGSTOP) for missing a suspend's deadline
    stopped_by_gmux: bool = False      # SIGSTOPped by gmuxd now (a restarted gmuxd continues it)
    last_report: dict = field(default_factory=dict)
    disk_bytes: int = 0                # its suspended state spilled to disk now (host RAM budget), bytes
    resume_failures: int = 0           # resumes that failed in a row (gmux.node.resume_retry)
    retry_at: Optional[float] = None   # when a hold for another try of its resume ends (time.time())
    # --- transient (not persisted) ---
    held: bool = False                 # suspended by the user: not scheduled until resumed
    target_gpu: Optional[int] = None   # migration destination
    started: bool = False              # has run at least once (a waiting job has no state to resume)
    spilled: bool = False              # its suspended state went to disk (host RAM budget) at least once
    spill_refused: bool = False        # the job answered a spill with an error: not asked again
    migratable: bool = False           # can continue in a new process from a checkpoint (explicit mode)
    agrees: bool = False               # a gang rank whose runtime agrees with its peers on the boundary to act at
    identity: Optional[bytes] = None   # ROUTER routing id of its agent, learned from its messages
    outbox: list = field(default_factory=list)    # commands waiting for the agent's routing id
    kill_requested: bool = False
    kill_reason: str = ""              # what its record says once killed, where the killer gave a reason
    registered: bool = False           # its process has registered (a submitted job's has not, at first)
    solo_windows: int = 0              # residencies the solo rate is measured over
    solo_seen: int = 0                 # solo residencies measured, ever (the packer waits for a fresh one)
    _window: list = field(default_factory=list)   # (t, step) samples of the current residency
    _solo_now: Optional[float] = None
    _step_offset: Optional[int] = None  # runtime step - agent boundary count (constant within one process)
    _solo_hist: list = field(default_factory=list)
    _late_told: Optional[float] = None  # the overdue command (by its send time) already told of in a decision
    _note: str = ""                     # the detail gmuxd wrote about its being stopped (cleared when over)

    @property
    def exclusive(self) -> bool:
        """Needs whole GPUs to itself: never time-sliced or packed with other jobs."""
        return self.gpus_wanted > 1 or self.gang is not None

    @property
    def final(self) -> bool:
        return self.state in ("exited", "failed", "killed", "lost")

    def count(self, boundaries: Optional[int], step: Optional[int] = None) -> None:
        """Keeps `step` current from the agent's boundary count (every message) and the runtime's step
        (reports, about once a second; after a restore the runtime's step does not start at 0)."""
        if boundaries is None:
            return
        self.boundaries = max(self.boundaries, boundaries)
        if step is not None:
            self._step_offset = step - boundaries
        if self._step_offset is not None:
            self.step = max(self.step, boundaries + self._step_offset)

    def unmovable(self) -> Optional[str]:
        """Why its reports say a new process would not continue it exactly (None: they say nothing of it)."""
        why = (self.last_report or {}).get("unmovable")
        return why if isinstance(why, str) and why else None

    def working_set(self) -> Optional[int]:
        """Memory this job needs on its GPU: the declared size, or the measured peak when larger or undeclared."""
        sizes = [s for s in (self.mem, self.mem_peak) if s is not None]
        return max(sizes) if sizes else None

    # --- rate measurement: mini-batches per second over the current residency, skipping its first sample
    # (the first mini-batches after a resume include warming caches and are not representative) ---
    def start_window(self) -> None:
        if self._solo_now is not None:
            self._solo_hist = (self._solo_hist + [self._solo_now])[-5:]
            self._solo_now = None
        self._window = []
        self.rate_now = None

    def forget_solo(self) -> None:
        """Its solo rate no longer holds (a kept pack is re-checked): measure it afresh, as at the start."""
        self._solo_now, self._solo_hist, self.rate_solo, self.solo_windows = None, [], None, 0

    def solo_measured(self, rate: Optional[float]) -> None:
        """The rate of the current residency, which has the GPU to itself.

        The solo rate is the best of the last few solo residencies: on a shared machine (or GPU) outside
        interference only ever lowers a rate, so the maximum is the least disturbed estimate.
        """
        if self._solo_now is None and rate is not None:
            self.solo_seen += 1
        self._solo_now = rate
        seen = self._solo_hist + ([rate] if rate is not None else [])
        self.rate_solo = max(seen) if seen else None
        self.solo_windows = len(seen)

    def sample(self, t: float, step: int) -> None:
        self._window.append((t, step))
        if len(self._window) > 256:
            del self._window[1:2]   # keep the first point (window start) and the recent ones
        self.rate_now = self.window_rate()

    def window_rate(self, since: Optional[float] = None) -> Optional[float]:
        pts = self._window[1:]
        if since is not None:
            pts = [p for p in pts if p[0] >= since]
        if len(pts) < 2 or pts[-1][0] <= pts[0][0]:
            return None
        return (pts[-1][1] - pts[0][1]) / (pts[-1][0] - pts[0][0])

    def rate_running(self) -> Optional[float]:
        """Its rate now: none unless it runs (rate_now stays the last residency's until the next starts, which the
        packer reads; a suspended, held or ended job does no mini-batches now)."""
        return self.rate_now if self.state == "running" else None

    def window_span(self) -> float:
        pts = self._window[1:]
        return pts[-1][0] - pts[0][0] if len(pts) >= 2 else 0.0

    def row(self) -> dict:
        d = {k: getattr(self, k) for k in IDENTITY}
        d["stats"] = {k: v for k, v in asdict(self).items()
                      if k not in IDENTITY and k not in TRANSIENT}
        return d

    def public(self) -> dict:
        """What `gmux ps --json` shows: everything but the token, transient routing state and the environment
        (its names only), bounded so that hundreds of jobs fit one reply whatever their argv or reports hold."""
        d = {k: v for k, v in asdict(self).items() if k not in TRANSIENT and k not in ("token", "env", "last_report")}
        d["argv"] = [a[:128] for a in self.argv[:16]] + (["..."] if len(self.argv) > 16 else [])
        d["cwd"], d["detail"] = self.cwd[:256], self.detail[:300]
        d["env"] = len(self.env)
        d["rate_now"] = self.rate_running()
        # (why it is unmovable in full: `gmux ps` and the cluster scheduler's refusals quote it)
        figures = ((k[:32], v[:512 if k == "unmovable" else 64] if isinstance(v, str) else v)
                   for k, v in self.last_report.items() if not isinstance(v, dict))
        d["report"] = dict(itertools.islice(figures, 32))
        d["working_set"] = self.working_set()
        return d


def gang_members(jobs: dict, gang_id: str) -> list:
    """The live ranks of a gang, by rank."""
    return sorted((j for j in jobs.values() if not j.final and j.gang and j.gang["id"] == gang_id),
                  key=lambda j: j.gang["rank"])


def unit_of(jobs: dict, job: Job) -> list:
    """The jobs acted on together: every live rank of a gang, or the job alone."""
    return gang_members(jobs, job.gang["id"]) if job.gang else [job]
