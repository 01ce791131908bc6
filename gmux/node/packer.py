"""Packing with introspection (Gandiva's rule), as a pure object.

Two jobs whose working sets fit together in a GPU's memory may run at the same time. Whether that pays is
not knowable in advance (they may compete for the same SMs, memory bandwidth, or, on a virtual GPU, CPU
cores), so it is measured: each job's *solo* rate is measured while it has the GPU alone; the pair then runs
together for a window; the pack is kept only if packed_a/solo_a + packed_b/solo_b exceeds 1 by a margin
(time-slicing the two gives exactly 1, minus switch costs). Otherwise the pair is unpacked, remembered as
incompatible for a while, and time-sliced. Every decision returns its numbers for the log.

The solo rates are measured on both sides of the packed window: after it, the pair is taken apart until each
job has had a fresh turn alone, and the judgement uses the best solo rate seen. Rates measured at different
times see different outside load (other jobs starting, another tenant's burst); with solo rates from before
the window only, a pair measured alone while the machine was busy and together once it was quiet looks like a
gain that is not there. The fresh turn bounds that error by the load's change within one turn.

A kept pack is judged again every `recheck` seconds it has run together (the jobs change phase; a neighbour
may start to saturate the device). Its old solo rates cannot judge it: a job whose phase changed has a new
solo rate too (one that stopped waiting on input is faster alone and slower packed). So a re-check undoes the
pack, the daemon forgets both solo rates, each job runs alone again (two turns, as at first) to measure a
fresh one, and the pair is tried together and judged by the same rule.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from gmux.util.sizes import format_size
from gmux.node.slicer import Slicer


@dataclass
class Rates:
    """What the packer needs to know about one job, measured by the daemon."""
    solo: Optional[float]       # mini-batches/s while alone on the GPU
    now: Optional[float]        # mini-batches/s over the current residency
    span: float                 # seconds the current residency's measurement covers
    solo_seen: int = 0          # solo residencies measured so far (grows by one with each fresh turn alone)


@dataclass
class Decision:
    kind: str                   # "trial", "keep", "unpack", "recheck" (measure a kept pack again)
    jobs: list
    numbers: dict
    text: str


@dataclass
class Packer:
    margin: float = 0.1         # keep a pack only if the normalised sum beats 1 + margin
    window: float = 5.0         # seconds of packed measurement before judging
    retry_after: float = 300.0  # an unpacked pair is not tried again for this long
    enabled: bool = True
    recheck: float = 1800.0     # seconds a kept pack runs together before it is measured again
    trial: Optional[frozenset] = None
    trial_start: Optional[float] = None
    packed: Optional[dict] = None                  # the trial's rates together, once its window is over
    marks: dict = field(default_factory=dict)      # each member's solo_seen when the window ended
    apart_since: Optional[float] = None
    rejected: dict = field(default_factory=dict)   # frozenset pair -> time of rejection
    kept: set = field(default_factory=set)
    together: dict = field(default_factory=dict)   # kept pair -> seconds run together since last judged
    again: set = field(default_factory=set)        # kept pairs being measured afresh (alone, then together)
    _seen: Optional[float] = None                  # when step() last ran (to count time run together)

    def step(self, slicer: Slicer, rates: dict[str, Rates], now: float) -> list[Decision]:
        """Judge a running trial, or start one. Mutates the slicer's packs; returns the decisions taken."""
        if not self.enabled:
            return []
        last, self._seen = self._seen, now
        if self.trial is not None:
            return self._judge(slicer, rates, now)
        for pair in sorted(self.kept, key=sorted):
            if pair == slicer.current == slicer.resident and pair in slicer.packs and last is not None:
                self.together[pair] = self.together.get(pair, 0.0) + (now - last)
            if self.together.get(pair, 0.0) >= self.recheck:
                return self._recheck(slicer, pair, rates)
        pair = self._candidate(slicer, rates, now)
        if pair is None:
            return []
        a, b = sorted(pair)
        slicer.pack(pair, run_now=True)
        self.trial, self.trial_start, self.packed = pair, None, None
        mem = {j: slicer.entries[j].mem for j in (a, b)}
        return [Decision("trial", [a, b], {"solo": {a: rates[a].solo, b: rates[b].solo}, "mem": mem,
                                           "gpu_mem": slicer.mem_total},
                         f"GPU {slicer.gpu}: trying {a}+{b} packed (solo {rates[a].solo:.2f} and "
                         f"{rates[b].solo:.2f} mini-batches/s; {format_size(sum(mem.values()))} of "
                         f"{format_size(slicer.mem_total)})")]

    def _recheck(self, slicer: Slicer, pair: frozenset, rates: dict[str, Rates]) -> list[Decision]:
        a, b = sorted(pair)
        slicer.unpack(pair)
        self.kept.discard(pair)
        self.together.pop(pair, None)
        self.again.add(pair)
        return [Decision("recheck", [a, b], {"solo": {j: rates[j].solo if j in rates else None for j in (a, b)},
                                             "after_s": self.recheck},
                         f"GPU {slicer.gpu}: measuring kept pack {a}+{b} again after {self.recheck:g} s together: "
                         f"each alone again (fresh solo rates), then together")]

    def _candidate(self, slicer: Slicer, rates: dict[str, Rates], now: float) -> Optional[frozenset]:
        packed = set().union(*slicer.packs) if slicer.packs else set()
        ready = [j for j, e in sorted(slicer.entries.items(), key=lambda kv: kv[1].order)
                 if j not in packed and not e.held and e.mem is not None
                 and rates.get(j) is not None and rates[j].solo]
        for i, a in enumerate(ready):
            for b in ready[i + 1:]:
                pair = frozenset((a, b))
                t = self.rejected.get(pair)
                if t is not None and now - t < self.retry_after:
                    continue
                if slicer.fits(pair):
                    return pair
        return None

    def _judge(self, slicer: Slicer, rates: dict[str, Rates], now: float) -> list[Decision]:
        pair = self.trial
        if not pair <= set(slicer.entries):
            self.trial = None       # a member left: nothing to judge
            return []
        if self.packed is None:
            return self._measure_together(slicer, pair, rates, now)
        # Apart again: wait for a fresh solo turn each, or judge on what is known once turns are overdue
        # (a member that cannot run alone must not stall every other trial on this GPU).
        overdue = now - self.apart_since > self.window + 2 * len(slicer.entries) * slicer.quantum
        if not overdue and any(rates[j].solo_seen <= self.marks[j] for j in pair):
            return []
        a, b = sorted(pair)
        packed = self.packed
        solo = {j: rates[j].solo for j in (a, b)}
        if any(not v for v in solo.values()):
            return self._give_up(slicer, pair, solo, now) if overdue else []
        norm = {j: packed[j] / solo[j] for j in (a, b)}
        total = sum(norm.values())
        self.trial, self.packed = None, None
        numbers = {"solo": solo, "packed": packed, "normalised": norm, "sum": total, "margin": self.margin,
                   "window_s": self.apart_since - self.trial_start, "apart_s": now - self.apart_since,
                   "fresh_solo": not overdue}
        detail = (f"{a} {packed[a]:.2f}/{solo[a]:.2f} + {b} {packed[b]:.2f}/{solo[b]:.2f} = {total:.2f}")
        again = pair in self.again
        self.again.discard(pair)
        numbers["recheck"] = again
        gains = total > 1 + self.margin
        if gains and slicer.fits(pair):
            slicer.pack(pair, run_now=True)
            self.kept.add(pair)
            self.together[pair] = 0.0
            return [Decision("keep", [a, b], numbers,
                             f"GPU {slicer.gpu}: {'still ' if again else ''}keeping {a}+{b} packed: {detail} "
                             f"> 1 + {self.margin}")]
        self._reject(pair, now)
        if gains:
            return [Decision("unpack", [a, b], numbers, f"GPU {slicer.gpu}: unpacking {a}+{b}: it would gain "
                             f"({detail}) but no longer fits in memory")]
        what = "the kept pack stopped gaining" if again else "time-slicing instead"
        return [Decision("unpack", [a, b], numbers,
                         f"GPU {slicer.gpu}: unpacking {a}+{b}, {what}: {detail} <= 1 + {self.margin}")]

    def _give_up(self, slicer: Slicer, pair: frozenset, solo: dict, now: float) -> list[Decision]:
        """A member with no rate alone long after the window (its rate was forgotten): with nothing to judge
        against, the pair time-slices, and other trials on this GPU may go on."""
        a, b = sorted(pair)
        packed, self.trial, self.packed = self.packed, None, None
        self.again.discard(pair)
        self._reject(pair, now)
        unknown = [j for j in (a, b) if not solo[j]]
        numbers = {"solo": solo, "packed": packed, "apart_s": now - self.apart_since, "fresh_solo": False,
                   "unknown": unknown}
        return [Decision("unpack", [a, b], numbers,
                         f"GPU {slicer.gpu}: unpacking {a}+{b} unjudged: no rate of {' or '.join(unknown)} alone "
                         f"{now - self.apart_since:.0f} s after the packed window; time-slicing")]

    def _reject(self, pair: frozenset, now: float) -> None:
        """Time-slice the pair from now on, and try it again only after retry_after."""
        self.kept.discard(pair)
        self.together.pop(pair, None)
        self.rejected[pair] = now

    def _measure_together(self, slicer: Slicer, pair: frozenset, rates: dict[str, Rates],
                          now: float) -> list[Decision]:
        """The packed window: once it is over, its rates are kept and the pair is taken apart for fresh solo
        turns (the judgement follows them)."""
        if pair not in slicer.packs:
            self.trial = None       # the pack was dissolved (memory grew): nothing to judge
            return []
        if not (pair == slicer.current == slicer.resident):
            return []               # not yet running together
        if self.trial_start is None:
            self.trial_start = now
        spans = [rates[j].span if j in rates else 0.0 for j in pair]
        if now - self.trial_start < self.window or min(spans) < 0.6 * self.window:
            return []
        packed = {j: rates[j].now for j in sorted(pair)}
        if any(v is None for v in packed.values()):
            return []
        self.packed, self.apart_since = packed, now
        self.marks = {j: rates[j].solo_seen for j in pair}
        slicer.unpack(pair)
        return []

    def forget(self, job: str) -> None:
        if self.trial is not None and job in self.trial:
            self.trial, self.packed = None, None
        self.kept = {p for p in self.kept if job not in p}
        self.again = {p for p in self.again if job not in p}
        self.together = {p: t for p, t in self.together.items() if job not in p}
