"""The policy interface: snapshot dataclasses in, action dataclasses out.

A policy is a pure, deterministic object. It is handed a read-only `Snapshot` of the cluster (jobs, machines,
what runs on every GPU, measured pair rates) and the `Event` that prompted the call, and answers with a list of
actions. It never reads a clock, does I/O, or imports torch/ZeroMQ/NVML: the same object drives `gmux-sim`
against simulated machines and `gmux-scheduler` against real daemons. A policy may keep private memory between
calls (for instance pairs it has seen lose when packed), as long as that memory is a function of the events it
was shown, so a replay of the same events yields the same actions.

The caller owns the snapshot and may mutate and reuse it between calls (the simulator does, to avoid rebuilding
82,000-job views on every event); a policy must therefore not hold references to snapshot objects across calls
expecting them unchanged, and must never mutate them.

Vocabulary used throughout:
- A job's *work* is measured in seconds of running alone on its requested GPUs ("solo seconds").
- A job's *rate* is its progress per wall-clock second relative to running alone (1.0 = solo speed).
- *Attained service* is GPU-seconds of GPU time the job has been scheduled for (Tiresias' measure).
- A GPU holds a list of *units*; a unit is a tuple of job ids that run concurrently (one job, or a packed
  pair). More than one unit on a GPU means the units are time-sliced in round-robin quanta.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING, Hashable

if TYPE_CHECKING:                  # for the annotation only: snapshot.py imports this module
    from .snapshot import Snapshot

JobId = Hashable


class JobState(enum.Enum):
    PENDING = "pending"        # arrived, never run
    RUNNING = "running"        # holds GPUs (alone, packed, or time-sliced)
    SUSPENDED = "suspended"    # ran, was pushed off its GPUs, state kept in host memory


@dataclass(slots=True)
class JobView:
    """One active job as the policy sees it. Completed jobs leave the snapshot."""

    job_id: JobId
    num_gpus: int                      # GPUs requested at submission (gang: all at once)
    job_type: str                      # model identity, the key into pair-rate measurements
    submit_time: float
    state: JobState = JobState.PENDING
    gpus: tuple = ()                   # GPU ids held now (empty unless RUNNING)
    packed_with: JobId | None = None   # partner when running concurrently on the same GPUs
    rate: float = 0.0                  # measured progress rate now (1.0 = solo)
    attained: float = 0.0              # GPU-seconds of service as of `updated_at`
    service_rate: float = 0.0          # GPU-seconds of service gained per second now
    updated_at: float = 0.0
    first_run: float | None = None     # when it first made progress (None: never ran)
    last_start: float | None = None    # when its current run (or last run) began
    last_stop: float | None = None     # when it was last suspended
    elastic: bool = False              # accepts a GPU count in [min_gpus, max_gpus]
    min_gpus: int = 0
    max_gpus: int = 0
    remaining_hint: float | None = None  # solo seconds left as of `updated_at`; oracles only (None when unknown)
    duration_hint: float | None = None   # solo seconds in total; oracles only
    mem_gib: float | None = None         # peak GPU memory, when measured
    owner: str | None = None             # who submitted it, when known (a job's siblings are its owner's)

    def attained_at(self, now: float) -> float:
        return self.attained + self.service_rate * max(0.0, now - self.updated_at)

    def remaining_at(self, now: float) -> float | None:
        if self.remaining_hint is None:
            return None
        return max(0.0, self.remaining_hint - self.rate * max(0.0, now - self.updated_at))


@dataclass(frozen=True, slots=True)
class MachineView:
    machine_id: int
    gpu_ids: tuple                     # global GPU ids on this machine
    gpu_mem_gib: float = 16.0
    gpu_type: str = "v100"


class EventKind(enum.Enum):
    ARRIVAL = "arrival"          # job_id arrived (already in the snapshot, PENDING)
    COMPLETION = "completion"    # job_id finished (already gone from the snapshot); its GPUs are released
    TIMER = "timer"              # a timer the policy asked for fired; `key` is what it passed to SetTimer
    MEASUREMENT = "measurement"  # a pack's measurement window ended; `job_id` is one member, rates are in pair_rates
    TICK = "tick"                # periodic wake-up (the caller's choice of period); nothing in particular changed


@dataclass(frozen=True, slots=True)
class Event:
    kind: EventKind
    job_id: JobId | None = None
    key: Hashable = None


# ---- actions -------------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Place:
    """Start a PENDING job on `gpus`. If a GPU already holds units, the job becomes a new time-sliced unit."""
    job_id: JobId
    gpus: tuple


@dataclass(frozen=True, slots=True)
class Resume:
    """Put a SUSPENDED job back on `gpus` (any GPUs, not necessarily its old ones)."""
    job_id: JobId
    gpus: tuple


@dataclass(frozen=True, slots=True)
class Suspend:
    """Take a RUNNING job off its GPUs at its next mini-batch boundary; its state is kept."""
    job_id: JobId


@dataclass(frozen=True, slots=True)
class Pack:
    """Run a PENDING or SUSPENDED job concurrently with RUNNING `partner`, on the partner's GPUs.

    The partner must run alone in its unit and hold the same number of GPUs; the pair must fit in memory."""
    job_id: JobId
    partner: JobId


@dataclass(frozen=True, slots=True)
class Unpack:
    """Split the pack that `job_id` is in: both stay on their GPUs, now time-sliced instead of concurrent."""
    job_id: JobId


@dataclass(frozen=True, slots=True)
class Migrate:
    """Move a RUNNING job to `gpus` (suspend, move state, resume). Leaves any pack or time-slice group."""
    job_id: JobId
    gpus: tuple


@dataclass(frozen=True, slots=True)
class Grow:
    """Give an elastic RUNNING job a larger GPU set `gpus` (a superset of what it holds)."""
    job_id: JobId
    gpus: tuple


@dataclass(frozen=True, slots=True)
class Shrink:
    """Give an elastic RUNNING job a smaller GPU set `gpus` (a subset of what it holds)."""
    job_id: JobId
    gpus: tuple


@dataclass(frozen=True, slots=True)
class SetTimer:
    """Ask to be called with Event(TIMER, key=key) at time `at` (absolute, in the snapshot's clock)."""
    at: float
    key: Hashable = None


Action = Place | Resume | Suspend | Pack | Unpack | Migrate | Grow | Shrink | SetTimer


class PolicyError(Exception):
    """An action that the cluster refuses: it names the job and why (a policy bug, or a stale snapshot)."""


class Policy:
    """Base class. Subclasses set `name` and implement `decide`.

    `preemptive`: whether the policy ever suspends jobs (the caller may skip suspend bookkeeping otherwise).
    `uses_oracle`: whether it reads remaining_hint/duration_hint (only the sjf, srtf and gmux-law yardsticks do)."""

    name = "base"
    preemptive = False
    uses_oracle = False

    def decide(self, snap: "Snapshot", event: Event) -> list:
        raise NotImplementedError

    def describe(self) -> dict:
        """Parameters that define this policy instance, for result files."""
        return {"name": self.name}


@dataclass(slots=True)
class PairRate:
    """Measured rates of two job types packed on one GPU, each relative to running alone (0, 0: does not fit)."""
    rate_a: float
    rate_b: float

    @property
    def fits(self) -> bool:
        return self.rate_a > 0.0 or self.rate_b > 0.0

    @property
    def gain(self) -> float:
        """Combined progress of the pair per unit time; > 1 means packing beats time-slicing them."""
        return self.rate_a + self.rate_b


def require(policy: str, **checks: tuple) -> None:
    """Refuses a policy's parameters (they come from users: gmux-sim --params) naming each one out of bounds and
    its value. checks: parameter -> (its value, whether it is acceptable, what is wanted)."""
    bad = [f"{name} = {value!r} (wanted: {wanted})" for name, (value, ok, wanted) in checks.items() if not ok]
    if bad:
        raise ValueError(f"{policy}: " + "; ".join(bad))
