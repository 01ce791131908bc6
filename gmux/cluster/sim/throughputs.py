"""The throughput table (Gavel's gavel_throughputs.json) and the job types it gives a trace's jobs.

The file is untrusted: every rate is checked when it is read (a finite number >= 0 where it belongs), and a
malformed one raises TraceError naming the file, the GPU type and the entry.

Job types. philly.csv has no model names, so each job gets a job type: a seeded random choice (numpy's PCG64
seeded with `seed`, one draw per row in file order) among the types measured at the job's scale factor (1, 2, 4
or 8 GPUs; jobs with other counts use the largest measured scale below theirs). The same seed and file always
give the same assignment, whatever window or sample is then selected. A type whose solo rate on the chosen GPU is
0 cannot run there (K80's memory holds no ResNet-50 at batch size 128 on 2 to 8 GPUs): it is no choice.

Suspect V100 pairs. About 80 V100 pairs report a packed throughput exactly equal to the solo one (packing would
be free), mostly with ResNet-18. We treat an exact equality as a measurement artefact: by default
(`suspect="p100"`) the pair's slowdown ratios are taken from the same pair measured on P100, the closest GPU
in the table; `suspect="drop"` marks the pair unmeasured-and-unpackable; `suspect="keep"` believes them.
A pair whose packed rates are both 0 does not fit in memory together; one where only one of them is 0 would stop
that job, which packing never may: it is unpackable too.
"""
from __future__ import annotations

import json
import math
import os

import numpy as np

from gmux.cluster.policies.api import PairRate
from gmux.cluster.sim.trace import Trace, TraceError, unreadable

SCALES = (1, 2, 4, 8)
SOLO = "null"           # the key of a type's solo rate among its pair entries
# Gavel's table is 1.2 MB; a file of gigabytes is not one, and json.load would hold several times its size.
MAX_TABLE_BYTES = 64 << 20


def _type_key(name: str) -> tuple[str, int]:
    # Keys look like "('ResNet-18 (batch size 16)', 1)"; parse without eval (untrusted file).
    inner = name.strip()
    if not (inner.startswith("('") and inner.endswith(")") and "', " in inner):
        raise ValueError(f"unrecognised job type key {name!r}")
    model, _, scale = inner[2:-1].rpartition("', ")
    try:
        return model, int(scale)
    except ValueError:
        raise ValueError(f"job type key {name!r}: scale {scale!r} is not a whole number") from None


def _rate(value, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
        raise ValueError(f"{where}: {value!r} is not a throughput (a finite number >= 0)")
    try:
        return float(value)
    except OverflowError:       # (an integer past the largest float, which JSON may hold: it was a traceback)
        raise ValueError(f"{where}: an integer of {len(str(value))} digits is not a throughput (a finite "
                         f"number >= 0)") from None


def _section(data: dict, name: str) -> dict[str, tuple[float, dict[str, tuple[float, float]]]]:
    """One GPU type's table, checked: job type -> (solo rate, {partner type: (its rate, partner's rate)})."""
    table = data[name]
    if not isinstance(table, dict):
        raise ValueError(f"{name}: expected an object of job types, got {type(table).__name__}")
    out = {}
    for key, entries in table.items():
        _type_key(key)
        if not isinstance(entries, dict) or SOLO not in entries:
            raise ValueError(f"{name}: {key}: expected an object with its solo rate under {SOLO!r}")
        pairs = {}
        for partner, pair in entries.items():
            if partner == SOLO:
                continue
            if partner not in table or not (isinstance(pair, list) and len(pair) == 2):
                raise ValueError(f"{name}: {key} -> {partner}: expected a known type and [rate, rate]")
            pairs[partner] = (_rate(pair[0], f"{name}: {key} -> {partner}"),
                              _rate(pair[1], f"{name}: {key} -> {partner}"))
        out[key] = (_rate(entries[SOLO], f"{name}: {key}: solo"), pairs)
    return out


class Throughputs:
    """One GPU type's rates: solo rates, pair rates (relative to solo), consolidation ratios."""

    def __init__(self, path: str, gpu_type: str = "v100", suspect: str = "p100"):
        if suspect not in ("p100", "drop", "keep"):
            raise ValueError(f"suspect must be 'p100', 'drop' or 'keep', not {suspect!r}")
        if not os.path.isfile(path):
            raise TraceError(f"{path}: no such throughput file")
        try:
            if os.path.getsize(path) > MAX_TABLE_BYTES:
                raise TraceError(f"{path}: {os.path.getsize(path):,} bytes, more than a throughput table's "
                                 f"{MAX_TABLE_BYTES >> 20} MiB (Gavel's is 1.2 MB)")
            with open(path) as f:
                data = json.load(f)
        except json.JSONDecodeError as e:
            raise TraceError(f"{path}: not valid JSON ({e})") from None
        except RecursionError:
            raise TraceError(f"{path}: not JSON gmux-sim reads (nested too deeply)") from None
        except (UnicodeDecodeError, OSError) as e:
            raise unreadable(path, e) from None
        except ValueError as e:     # (an integer of more digits than Python converts: the error named no file)
            raise TraceError(f"{path}: not JSON gmux-sim reads ({e})") from None
        if not isinstance(data, dict) or gpu_type not in data:
            raise TraceError(f"{path}: no GPU type {gpu_type!r} (has "
                             f"{', '.join(sorted(data)) if isinstance(data, dict) else 'nothing'})")
        try:
            self._build(data, gpu_type, suspect)
        except ValueError as e:
            raise TraceError(f"{path}: {e}") from None

    def _build(self, data: dict, gpu_type: str, suspect: str) -> None:
        table = _section(data, gpu_type)
        self.gpu_type = gpu_type
        self.solo = {key: solo for key, (solo, _) in table.items() if solo > 0}
        self.cannot_run = sorted(key for key in table if key not in self.solo)
        self.by_scale: dict[int, list[str]] = {s: [] for s in SCALES}
        for key in self.solo:
            scale = _type_key(key)[1]
            if scale in self.by_scale:
                self.by_scale[scale].append(key)
        for s, keys in self.by_scale.items():
            if not keys:
                raise ValueError(f"{gpu_type}: no job type that runs at scale factor {s}")
            keys.sort()
        ref = _section(data, "p100") if suspect == "p100" and "p100" in data else {}
        self.pairs: dict[tuple[str, str], PairRate] = {}
        self.no_fit: set[tuple[str, str]] = set()
        self.suspect_pairs: list[tuple[str, str]] = []
        for a, (_, partners) in table.items():
            for b, (ta, tb) in partners.items():
                if a not in self.solo or b not in self.solo:
                    continue
                if ta == 0 or tb == 0:
                    self.no_fit.add((a, b))
                    continue
                ra, rb = ta / self.solo[a], tb / self.solo[b]
                if ta == self.solo[a] or tb == self.solo[b]:
                    self.suspect_pairs.append((a, b))
                    if suspect == "drop":
                        continue
                    if suspect == "p100":
                        alt = ref.get(a, (0.0, {}))[1].get(b)
                        if alt is None or 0 in alt or ref[a][0] == 0 or ref[b][0] == 0:
                            continue
                        ra, rb = alt[0] / ref[a][0], alt[1] / ref[b][0]
                self.pairs[(a, b)] = PairRate(min(ra, 1.0), min(rb, 1.0))
        self.unconsolidated: dict[str, float] = {}
        name = gpu_type + "_unconsolidated"
        spread = data.get(name, {})
        if not isinstance(spread, dict):
            raise ValueError(f"{name}: expected an object of job types, got {type(spread).__name__}")
        for key, entries in spread.items():
            if key not in self.solo:
                continue
            if not isinstance(entries, dict) or SOLO not in entries:
                raise ValueError(f"{name}: {key}: expected an object with its rate under {SOLO!r}")
            rate = _rate(entries[SOLO], f"{name}: {key}")
            if rate == 0:
                raise ValueError(f"{name}: {key}: rate 0 (a job spread over machines always progresses)")
            # Above 1.0 is measurement noise: spreading a job never makes it faster.
            self.unconsolidated[key] = min(1.0, rate / self.solo[key])

    def pair(self, a: str, b: str) -> PairRate | None:
        return self.pairs.get((a, b))

    def fits(self, a: str, b: str) -> bool:
        return (a, b) not in self.no_fit and (b, a) not in self.no_fit

    @staticmethod
    def scale_of(num_gpus: int) -> int:
        return max(s for s in SCALES if s <= num_gpus)


def assign_types(trace: Trace, tput: Throughputs, seed: int = 0, elastic_fraction: float = 0.0) -> None:
    """Give each job a type (and, for a seeded fraction of single-machine jobs, elasticity), in file order."""
    if not 0.0 <= elastic_fraction <= 1.0:
        raise ValueError(f"elastic_fraction must be in [0, 1], not {elastic_fraction}")
    rng = np.random.Generator(np.random.PCG64(seed))
    picks = rng.random(len(trace.jobs))
    elastic = rng.random(len(trace.jobs))
    for j, u, e in zip(trace.jobs, picks, elastic):
        keys = tput.by_scale[tput.scale_of(j.num_gpus)]
        j.job_type = keys[int(u * len(keys))]
        j.elastic = bool(e < elastic_fraction)
