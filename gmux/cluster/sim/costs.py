"""What a suspend, a resume and a migration cost, per job type, from gmux's own measurements.

A suspend copies a job's live state off its GPUs at a mini-batch boundary; a resume copies it back; a move to
another machine checkpoints, streams and restores it in a new process. Each is GPU time with no progress, so the
simulator charges it as a stall on the GPUs (see cluster.py for who pays it). The numbers:

- **Bytes per job type.** What survives a mini-batch boundary is weights, gradients and two Adam moments: 16
  bytes per fp32 parameter (activations are freed by then; gmux copies only live ranges). Parameter counts are
  the published sizes of the models behind gavel_throughputs.json's job types (`PARAMS_M` below); each GPU of a
  data-parallel job holds one replica and copies over its own link, so the time does not grow with GPU count.
- **Copy rate** `copy_gbps` = 5.0 GB/s: gmux's allocator-tier suspend/resume measured 4.4-5.2 GB/s of copy
  (benchmarks/README.md, native_swap, 1 GiB all live). That is a host-memory path on 2 shared cores; a pinned
  PCIe link is faster (~25 GB/s Gen4), so every preemptive policy is charged more here than on a GPU, not less.
- **Fixed part** `switch_fixed_s` = 0.05 s per suspend or resume: command round trip (p99 ~20 ms, gmuxd's
  command-latency benchmark) plus unmapping/mapping the job's pages (40-75 ms per GiB measured, ~20 ms for a
  typical job).
- **Another machine**, from gmux's measured cross-machine moves (benchmarks/README.md, "Cross-machine moves,
  eighteenth session": the whole `benchmarks/cluster.py` at ddc6032, medians of three moves, the sealed stream
  with a warm target, gmux's default). A move has two parts:
  - **Warm-up** (`cross_warmup_s` 0.07 s + `cross_warmup_s_per_gib` 1.19 s/GiB): the target's process (warm:
    torch already imported) builds the model while the job computes on at its source; the target's GPUs are
    reserved for it and idle. Measured as the move's total (request to the target heard) minus its downtime:
    0.17, 0.34 and 1.27 s at 64 MiB, 256 MiB and 1 GiB (a bigger model takes longer to build, and the source's
    wait for its next boundary, up to a mini-batch, is in it too); the line is the least-squares fit through the
    three (within 0.04 s of each). The sixteenth session's 0.45 s + 1.11 s/GiB had ~0.3 s more of it: the
    target's link noticed the new process and its first boundary up to 0.2 s late each.
  - **Stall** (`cross_start_s` 0.16 s + `cross_s_per_gib` 2.33 s/GiB): the job stopped, from its last boundary
    at the source to its first at the target. Measured downtime 0.37, 0.88 and 3.22 s at 64 MiB, 256 MiB and
    1 GiB, less the target's first mini-batch that the downtime includes (0.03, 0.18, 0.73 s of it; in the
    simulator that mini-batch is progress at the job's speed): 0.34, 0.70, 2.50 s; least-squares line through
    the three (within 0.05 s of each). Before: 0.14 s + 2.26 s/GiB (sixteenth session), the fifth round's
    0.06 s + 3.26 s/GiB (the checkpoint copied through pipes, with 3.11 s + 1.70 s/GiB of warm-up in a cold
    interpreter), and before that one 3.5 s + 7.9 s/GiB stall from 10-12 s moves that started the new process
    inside the downtime.
  The engine charges both (cluster.py): during the warm-up the job keeps its source's speed (its progress is
  credited) while it holds its target GPUs, which count as busy; the stall follows on the target; the source's
  GPUs are busy until the target has restored (the source streams from its live memory and is released then).
  A move between GPUs of one machine costs a suspend plus a resume and has no warm-up (same process).
- Time-slicing (Gandiva's) pays one suspend and one resume per quantum.

`suspend_s`/`resume_s`/`migrate_s` given explicitly replace the model with flat figures for every job (hand-made
tests, sensitivity runs from the command line); a flat `migrate_s` is all stall, with no warm-up.
"""
from __future__ import annotations

from dataclasses import dataclass, field

# Millions of parameters of the models behind the Gavel job types (published sizes; the model name is the part
# of the type key before " (batch size ...)").
PARAMS_M = {
    "ResNet-18": 11.2,        # CIFAR-10 ResNet-18
    "ResNet-50": 25.6,        # ImageNet ResNet-50
    "Transformer": 52.0,      # base Transformer on Multi30k (small vocabularies)
    "LM": 13.5,               # 2-layer LSTM word LM, Wikitext-2 (33k-word embedding and decoder)
    "Recommendation": 40.0,   # autoencoder recommender on ML-20M (item-sized input and output layers)
    "A3C": 1.2,               # Atari actor-critic
    "CycleGAN": 28.3,         # two ResNet generators + two PatchGAN discriminators
}
DEFAULT_PARAMS_M = 25.0      # an unknown type is costed like a ResNet-50
BYTES_PER_PARAM = 16         # fp32 weight + gradient + two Adam moments


def model_of(job_type: str) -> str:
    """"('ResNet-50 (batch size 64)', 4)" -> "ResNet-50"; other strings are returned as they are."""
    name = job_type
    if name.startswith("('"):
        name = name[2:].split("',", 1)[0]
    return name.split(" (", 1)[0]


MAX_COST_S = 100 * 365.25 * 86400    # any time a cost is: as long as a trace's longest job may be (trace.py)
COPY_GBPS = (1e-6, 1e6)               # a copy rate from a kilobyte to a petabyte a second


@dataclass
class Costs:
    copy_gbps: float = 5.0
    switch_fixed_s: float = 0.05
    cross_start_s: float = 0.16          # stall of a move to another machine: fixed part
    cross_s_per_gib: float = 2.33        # ... and per GiB of state
    cross_warmup_s: float = 0.07         # the target's process building the model, the job still at its source
    cross_warmup_s_per_gib: float = 1.19
    quantum_s: float = 60.0
    measure_s: float = 120.0
    elastic_efficiency: float = 0.9
    max_units_per_gpu: int = 8
    suspend_s: float | None = None       # flat overrides of the model (None: use the model)
    resume_s: float | None = None
    migrate_s: float | None = None
    params_m: dict = field(default_factory=lambda: dict(PARAMS_M))

    def __post_init__(self):
        for k in ("copy_gbps", "switch_fixed_s", "cross_start_s", "cross_s_per_gib", "cross_warmup_s",
                  "cross_warmup_s_per_gib", "quantum_s", "measure_s",
                  "elastic_efficiency", "max_units_per_gpu", "suspend_s", "resume_s", "migrate_s"):
            v = getattr(self, k)
            if v is None and k in ("suspend_s", "resume_s", "migrate_s"):
                continue
            if not (isinstance(v, (int, float)) and v >= 0):
                raise ValueError(f"cost {k} must be a non-negative number, not {v!r}")
            if k.endswith("_s") and v > MAX_COST_S:
                # (a suspend of 1e300 s ran, and gave JCTs of 6.7e299 s on a clock that no longer counts seconds)
                raise ValueError(f"cost {k} is {v:.3g} s, more than {MAX_COST_S:.3g} s (100 years)")
        if not COPY_GBPS[0] <= self.copy_gbps <= COPY_GBPS[1]:
            raise ValueError(f"copy_gbps must be from {COPY_GBPS[0]:g} to {COPY_GBPS[1]:g} GB/s, not "
                             f"{self.copy_gbps:.3g}")
        if self.max_units_per_gpu < 1:
            raise ValueError("max_units_per_gpu must be at least 1")
        self._memo: dict = {}

    # ---- per job type ---------------------------------------------------------------------------------------
    def state_gib(self, job_type: str) -> float:
        return self.params_m.get(model_of(job_type), DEFAULT_PARAMS_M) * 1e6 * BYTES_PER_PARAM / 2 ** 30

    def _copy_s(self, job_type: str) -> float:
        return self.state_gib(job_type) * 2 ** 30 / (self.copy_gbps * 1e9)

    def suspend(self, job_type: str) -> float:
        """Seconds the GPUs stay busy after a suspend (copy-out), before another job can use them."""
        if self.suspend_s is not None:
            return self.suspend_s
        return self.switch_fixed_s + self._copy_s(job_type)

    def resume(self, job_type: str) -> float:
        """Seconds a resumed job holds its GPUs before it makes progress (copy-in)."""
        if self.resume_s is not None:
            return self.resume_s
        return self.switch_fixed_s + self._copy_s(job_type)

    def migrate(self, job_type: str, cross_machine: bool) -> float:
        """Seconds a moved job is stopped on its new GPUs before it makes progress (after any warm-up)."""
        if self.migrate_s is not None:
            return self.migrate_s
        if not cross_machine:
            return self.suspend(job_type) + self.resume(job_type)
        return self.cross_start_s + self.cross_s_per_gib * self.state_gib(job_type)

    def warmup(self, job_type: str, cross_machine: bool) -> float:
        """Seconds a move holds its new GPUs idle before the stall while the job computes on at its source (the
        target's new process starting); 0 within a machine and under a flat `migrate_s`."""
        if self.migrate_s is not None or not cross_machine:
            return 0.0
        return self.cross_warmup_s + self.cross_warmup_s_per_gib * self.state_gib(job_type)

    def switch_factor(self, job_type: str) -> float:
        """Share of a time-sliced quantum that is progress (one suspend + one resume per quantum). Checked here,
        where a policy first time-slices: long switches are no error for one that never does (SRTF)."""
        f = self._memo.get(job_type)
        if f is None:
            switch = self.suspend(job_type) + self.resume(job_type)
            if self.quantum_s <= switch:
                raise ValueError(f"time-slicing {job_type}: quantum_s ({self.quantum_s:g} s) must exceed its suspend "
                                 f"+ resume ({switch:.6g} s), or it makes no progress")
            f = self._memo[job_type] = 1.0 - switch / self.quantum_s
        return f

    # ---- for the run summary --------------------------------------------------------------------------------
    def table(self) -> list[dict]:
        """The model's figures per model name, as printed in a run's summary."""
        rows = []
        for m in sorted(self.params_m):
            rows.append({"model": m, "state_gib": round(self.state_gib(m), 3), "suspend_s": round(self.suspend(m), 3),
                         "resume_s": round(self.resume(m), 3), "migrate_local_s": round(self.migrate(m, False), 3),
                         "warmup_cross_s": round(self.warmup(m, True), 2),
                         "migrate_cross_s": round(self.migrate(m, True), 2)})
        return rows

    def summary_lines(self) -> list[str]:
        if self.suspend_s is not None or self.resume_s is not None or self.migrate_s is not None:
            head = (f"costs: flat overrides suspend {self.suspend_s} s, resume {self.resume_s} s, migrate "
                    f"{self.migrate_s} s (None: the model below)")
        else:
            head = "costs: model from gmux's measurements"
        lines = [head + f"; copy {self.copy_gbps} GB/s, fixed {self.switch_fixed_s} s per switch, other machine: "
                 f"warm-up {self.cross_warmup_s} s + {self.cross_warmup_s_per_gib} s/GiB (job still at its source, "
                 f"target GPUs held) then stall {self.cross_start_s} s + {self.cross_s_per_gib} s/GiB, quantum "
                 f"{self.quantum_s} s"]
        for r in self.table():
            lines.append(f"  {r['model']:15s} {r['state_gib']:6.3f} GiB  suspend {r['suspend_s']:.3f} s  resume "
                         f"{r['resume_s']:.3f} s  move here {r['migrate_local_s']:.3f} s  other machine "
                         f"{r['warmup_cross_s']:.2f} s warm-up + {r['migrate_cross_s']:.2f} s stall")
        return lines
