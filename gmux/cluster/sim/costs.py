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
- **Another machine** (`cross_start_s` 3.5 s + `cross_s_per_gib` 7.9 s/GiB): a straight line through gmux's
  measured cross-machine migrations (benchmarks/README.md, cluster mode: ~4.1 s at 64 MiB, dominated by the new
  process's start, and 10-12 s at 1 GiB). A move between GPUs of one machine costs a suspend plus a resume.
- Time-slicing (Gandiva's) pays one suspend and one resume per quantum.

`suspend_s`/`resume_s`/`migrate_s` given explicitly replace the model with flat figures for every job (hand-made
tests, sensitivity runs from the command line).
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


@dataclass
class Costs:
    copy_gbps: float = 5.0
    switch_fixed_s: float = 0.05
    cross_start_s: float = 3.5
    cross_s_per_gib: float = 7.9
    quantum_s: float = 60.0
    measure_s: float = 120.0
    elastic_efficiency: float = 0.9
    max_units_per_gpu: int = 8
    suspend_s: float | None = None       # flat overrides of the model (None: use the model)
    resume_s: float | None = None
    migrate_s: float | None = None
    params_m: dict = field(default_factory=lambda: dict(PARAMS_M))

    def __post_init__(self):
        for k in ("copy_gbps", "switch_fixed_s", "cross_start_s", "cross_s_per_gib", "quantum_s", "measure_s",
                  "elastic_efficiency", "max_units_per_gpu", "suspend_s", "resume_s", "migrate_s"):
            v = getattr(self, k)
            if v is None and k in ("suspend_s", "resume_s", "migrate_s"):
                continue
            if not (isinstance(v, (int, float)) and v >= 0):
                raise ValueError(f"cost {k} must be a non-negative number, not {v!r}")
        if not self.copy_gbps > 0:
            raise ValueError("copy_gbps must be positive")
        if self.max_units_per_gpu < 1:
            raise ValueError("max_units_per_gpu must be at least 1")
        worst = max([self.suspend("x") + self.resume("x")] +
                    [self.suspend(m) + self.resume(m) for m in self.params_m])
        if self.quantum_s <= worst:
            raise ValueError(f"quantum_s must exceed a suspend + resume ({worst:.2f} s), or time-slicing makes no "
                             f"progress")
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
        """Seconds a moved job holds its new GPUs before it makes progress."""
        if self.migrate_s is not None:
            return self.migrate_s
        if not cross_machine:
            return self.suspend(job_type) + self.resume(job_type)
        return self.cross_start_s + self.cross_s_per_gib * self.state_gib(job_type)

    def switch_factor(self, job_type: str) -> float:
        """Share of a time-sliced quantum that is progress (one suspend + one resume per quantum)."""
        f = self._memo.get(job_type)
        if f is None:
            f = self._memo[job_type] = 1.0 - (self.suspend(job_type) + self.resume(job_type)) / self.quantum_s
        return f

    # ---- for the run summary --------------------------------------------------------------------------------
    def table(self) -> list[dict]:
        """The model's figures per model name, as printed in a run's summary."""
        rows = []
        for m in sorted(self.params_m):
            rows.append({"model": m, "state_gib": round(self.state_gib(m), 3), "suspend_s": round(self.suspend(m), 3),
                         "resume_s": round(self.resume(m), 3), "migrate_local_s": round(self.migrate(m, False), 3),
                         "migrate_cross_s": round(self.migrate(m, True), 2)})
        return rows

    def summary_lines(self) -> list[str]:
        if self.suspend_s is not None or self.resume_s is not None or self.migrate_s is not None:
            head = (f"costs: flat overrides suspend {self.suspend_s} s, resume {self.resume_s} s, migrate "
                    f"{self.migrate_s} s (None: the model below)")
        else:
            head = "costs: model from gmux's measurements"
        lines = [head + f"; copy {self.copy_gbps} GB/s, fixed {self.switch_fixed_s} s per switch, other machine "
                 f"{self.cross_start_s} s + {self.cross_s_per_gib} s/GiB, quantum {self.quantum_s} s"]
        for r in self.table():
            lines.append(f"  {r['model']:15s} {r['state_gib']:6.3f} GiB  suspend {r['suspend_s']:.3f} s  resume "
                         f"{r['resume_s']:.3f} s  move here {r['migrate_local_s']:.3f} s  other machine "
                         f"{r['migrate_cross_s']:.2f} s")
        return lines
