"""How much service a job still needs, predicted from the jobs seen so far: the Gittins index of the empirical
service distribution, learned online.

No job's duration is known, but every completed job's service (GPU-seconds) is. For a job that has received
service `a`, the Gittins index is the best ratio, over how much more service `d` one is willing to give it, of
the chance it finishes within `d` to the service that costs:

    G(a) = max over d > 0 of  P(S - a <= d | S > a) / E[min(S - a, d) | S > a]

and its inverse, in GPU-seconds, reads as an *effective remaining size*: serving the job with the smallest one
first minimises mean completion time among policies that do not know sizes (Gittins; Aalto, Ayesta and
Righter 2009 for the M/G/1 queue). Its shape follows the data, with no knob to set:
- where durations are heavy-tailed (most jobs short, a few very long), the effective size grows with attained
  service, and the rule is least-attained-service (what Tiresias hard-codes);
- where jobs have a typical length (a mode: e.g. 4-GPU jobs that mostly run ~50 h), a job approaching it gains
  priority instead of losing it, as it should: it is about to finish. LAS gets this backwards, which is where
  it lost most to the SRTF oracle on Philly's small, overloaded VCs.
The distribution is kept per GPU count (wide jobs are often a different population) and pooled while a class
has too few samples; with too few samples overall the effective size is the attained service itself (LAS).
Where fewer than `TAIL_SAMPLES` samples lie above a job's attained service, the missing ones are taken to run
as long again (LAS's assumption) and the few real ones count for what they weigh; past every sample of its
class and of the pool, a job joins the last queue, where jobs go in arrival order. Ranking those by attained
service instead made each new job pass the ones nearly done: on synthetic wide jobs of two typical lengths
under overload (benchmarks/synthetic.py) the long ones, 90% done, waited behind every newcomer and gmux took
1.55x Tiresias' average JCT.

Censored (gmux's default): a class's law is its most recent `window` *arrivals*, those that finished known
exactly and those still in the system known only to need more than they have had (Kaplan-Meier). Completions
alone are biased under overload: the short jobs finish, the long ones wait, so the law says long jobs are rare,
new jobs are ranked as short, and the long ones wait longer still.

Only the most recent `window` completions (or arrivals) of a class (and of the pool) count: a cluster's job
mix drifts (new projects, sweeps of near-identical jobs, deadlines), and a distribution of everything since the
start answers for a workload that is gone. What it bought on Philly at x0.25 (gmux_default.py has the commands):
suspends per job 0.31 -> 0.19 (in 6214e9, 41,226 one-GPU jobs, 0.38 -> 0.13), average JCT within noise (held-out
VCs 11.25 -> 11.19 h, tuned 8.62 -> 8.58; re-evaluating the model one completion earlier or later moves such
figures by up to 1%). The window was chosen on the tuned VCs: of completions, 50, 100, 200 and 400 gave 8.69, 8.68,
8.58 and 8.63 h there; of arrivals for the censored law, 200, 400, 800 and 1,600 gave 8.73, 8.67, 8.57 and 8.60 h
(x0.35: 6.16, 6.08, 6.05, 6.05), so it is 800.

Cost: the index is evaluated on a geometric grid of attained service (factor 2 from 60 GPU-seconds, or
`per_octave` points per doubling) against 32 quantiles of the remaining samples, and only once a tenth of the
samples (at least 10) are new since it was last evaluated; a lookup is one bisect.
"""
from __future__ import annotations

import bisect
import math
from collections import deque

GRID0 = 60.0          # GPU-seconds: the first grid point (a minute on one GPU)
GRID_POINTS = 28      # up to 60 x 2^27 GPU-s, far beyond any job
MIN_SAMPLES = 30      # fewer completions than this: not a distribution yet
MAX_WINDOW = 10_000_000   # samples per class: beyond it the law is memory, not recency
MAX_PER_OCTAVE = 64   # finer than 1% steps in size says nothing a job's own noise does not swamp
TAIL_SAMPLES = 8      # fewer samples above the attained service than this: extrapolate (20 ranked the
                      # small VCs' first weeks by extrapolation alone: 126 h against 107 h there)
QUANTILES = 32
WINDOW = 800          # recent arrivals per class that make its distribution (gmux_default.py: chosen on the
                      # tuned VCs)


def grid(k: int, per_octave: int = 1) -> float:
    """The k-th grid point: 0, then GRID0 and `per_octave` points for every doubling after it."""
    return 0.0 if k == 0 else GRID0 * 2.0 ** ((k - 1) / per_octave)


def grid_floor(a: float, per_octave: int = 1) -> int:
    """The index of the largest grid point <= a."""
    if a < GRID0:
        return 0
    k = 1 + int(math.floor(per_octave * math.log2(a / GRID0)))
    if grid(k, per_octave) > a:          # log2's rounding, either way, at a grid point itself
        k -= 1
    elif grid(k + 1, per_octave) <= a:
        k += 1
    return min(grid_points(per_octave) - 1, k)


def grid_points(per_octave: int = 1) -> int:
    return (GRID_POINTS - 1) * per_octave + 1


class _Samples:
    """One class's law: the most recent completions, or (censored) the most recent arrivals, those that finished
    known exactly and those still in the system known only to need more than they have had."""
    __slots__ = ("values", "cohort", "done", "finished", "sorted", "wprefix", "vprefix", "tail", "evaluated_at",
                 "added", "eff", "per_octave")

    def __init__(self, window: int, per_octave: int = 1, censored: bool = False):
        self.per_octave = per_octave
        self.values: deque = deque(maxlen=window)     # the most recent completions only (uncensored)
        self.cohort: deque | None = deque(maxlen=window) if censored else None   # recent arrivals' ids
        self.done: dict = {}         # cohort member -> its service once it completed, None before
        self.finished = 0            # members that completed
        self.sorted: list = []       # completed services, ascending
        self.wprefix: list = [0.0]   # their weights, summed (1 each uncensored; Kaplan-Meier masses, censored)
        self.vprefix: list = [0.0]   # weight x service, summed
        self.tail = 0.0              # weight beyond every completion (members alive past the longest one)
        self.evaluated_at = 0        # samples at the last evaluation
        self.added = 0               # completions since then
        self.eff: list = []          # effective remaining size at each grid point (None: extrapolate)

    def arrive(self, jid) -> None:
        if jid in self.done:
            return           # a job seen again (released from a hold, back from a lost machine) is one member
        if len(self.cohort) == self.cohort.maxlen:
            self.finished -= self.done.pop(self.cohort[0]) is not None
        self.cohort.append(jid)
        self.done[jid] = None

    def add(self, value: float, jid=None) -> None:
        if self.cohort is None:
            self.values.append(value)
        elif self.done.get(jid, 0.0) is None:      # a member (one that left the cohort is no evidence here)
            self.done[jid] = value
            self.finished += 1
        else:
            return
        self.added += 1

    def samples(self) -> int:
        return len(self.values) if self.cohort is None else self.finished

    def stale(self) -> bool:
        n = self.samples()
        return n >= MIN_SAMPLES and self.added >= 10 and 10 * self.added >= self.evaluated_at

    def evaluate(self, attained=None) -> None:
        """Rebuild the law. Censored, `attained(id)` gives the service a member still in the system has had so
        far (None: gone without completing, no evidence), and the law is the Kaplan-Meier estimate: completions
        under overload are mostly the short jobs, while the long ones wait, so completions alone would say long
        jobs are rarer than they are, rank new jobs as short, and starve the long ones further."""
        if self.cohort is None:
            obs = [(v, 0) for v in self.values]
        else:
            obs = []
            for jid in self.cohort:
                if self.done[jid] is not None:
                    obs.append((self.done[jid], 0))
                else:
                    a = attained(jid) if attained is not None else None
                    if a is not None and a > 0.0:
                        obs.append((a, 1))
        obs.sort()                   # at a tie a completion comes first: the censored one was still at risk
        at_risk = surv = float(len(obs))
        s, wp, vp = [], [0.0], [0.0]
        for v, censored in obs:
            if not censored:
                w = surv / at_risk   # exactly 1.0 while nothing is censored
                surv -= w
                s.append(v)
                wp.append(wp[-1] + w)
                vp.append(vp[-1] + w * v)
            at_risk -= 1.0
        self.sorted, self.wprefix, self.vprefix, self.tail = s, wp, vp, max(0.0, surv)
        self.evaluated_at = self.samples()
        self.added = 0
        self.eff = [self._effective(grid(k, self.per_octave)) for k in range(grid_points(self.per_octave))]

    def _effective(self, a: float):
        s, wp, vp = self.sorted, self.wprefix, self.vprefix
        n = len(s)
        i = bisect.bisect_right(s, a)
        m = n - i
        if m < TAIL_SAMPLES:
            return self._padded(a, i) if m else None
        above = wp[n] - wp[i] + self.tail
        best = 0.0
        seen = set()
        for q in range(1, QUANTILES + 1):
            j = i + (m - 1) * q // QUANTILES
            if j in seen:
                continue
            seen.add(j)
            done = wp[j + 1] - wp[i]
            cost = (vp[j + 1] - vp[i]) - done * a + (above - done) * (s[j] - a)
            if cost > 0:
                best = max(best, done / cost)
        return 1.0 / best if best > 0 else None

    def _padded(self, a: float, i: int):
        """Too few samples above `a` to read a tail: the missing ones are taken to run as long again (2a, the
        least-attained-service assumption), so a few completions move the index only as much as they weigh."""
        s, wp = self.sorted, self.wprefix
        pts = [(s[j], wp[j + 1] - wp[j]) for j in range(i, len(s))]
        pts.append((2.0 * a if a > 0 else GRID0, float(TAIL_SAMPLES - len(pts)) + self.tail))
        pts.sort()
        total = sum(w for _, w in pts)
        best, done, spent = 0.0, 0.0, 0.0
        for v, w in pts:
            # serve up to v: those finishing by then cost their service, the rest (total - done) cost v - a
            done += w
            spent += w * (v - a)
            cost = spent + (total - done) * (v - a)
            if cost > 0:
                best = max(best, done / cost)
        return 1.0 / best if best > 0 else None


class ServiceModel:
    """The service law of each GPU-count class, and the effective remaining size of a job in it.

    Uncensored (the default), a class's law is its most recent completions. Censored, it is its most recent
    arrivals (`arrive`), read by Kaplan-Meier: `attained(job_id)` says how much service a member still in the
    system has had (None once it is gone)."""

    def __init__(self, window: int = WINDOW, per_octave: int = 1, attained=None):
        if not MIN_SAMPLES <= window <= MAX_WINDOW:
            raise ValueError(f"window must hold from {MIN_SAMPLES} to {MAX_WINDOW:,} samples, got {window}")
        if not 1 <= per_octave <= MAX_PER_OCTAVE:
            raise ValueError(f"per_octave must be from 1 to {MAX_PER_OCTAVE}, got {per_octave}")
        self.window = window
        self.per_octave = per_octave
        self.attained = attained
        self._by: dict = {}
        self._all = self._samples()
        self.version = 0             # bumps whenever an evaluation changed the answers

    @property
    def censored(self) -> bool:
        return self.attained is not None

    def _samples(self) -> _Samples:
        return _Samples(self.window, self.per_octave, self.censored)

    def _class(self, num_gpus: int) -> _Samples:
        k = self.klass(num_gpus)
        c = self._by.get(k)
        if c is None:
            c = self._by[k] = self._samples()
        return c

    @staticmethod
    def klass(num_gpus: int) -> int:
        return 1 << max(0, int(num_gpus).bit_length() - 1)     # 1, 2, 4, 8, 16, ...

    def arrive(self, num_gpus: int, job_id) -> None:
        """A job joined the class (censored models only: the others learn from completions alone)."""
        if self.censored:
            for x in (self._class(num_gpus), self._all):
                x.arrive(job_id)

    def add(self, num_gpus: int, service: float, job_id=None) -> None:
        service = max(service, 1e-3)
        for x in (self._class(num_gpus), self._all):
            x.add(service, job_id)
            if x.stale():
                x.evaluate(self.attained)
                self.version += 1

    def effective(self, num_gpus: int, attained: float) -> float:
        """Effective remaining size (GPU-seconds) of a job of `num_gpus` with `attained` service, at the grid
        point below it (so it changes only when the job crosses a grid point)."""
        k = grid_floor(attained, self.per_octave)
        known = False
        for x in (self._by.get(self.klass(num_gpus)), self._all):
            if x is not None and x.eff:
                known = True
                e = x.eff[k]
                if e is not None:
                    return e
        return self.beyond if known else max(grid(k, self.per_octave), GRID0)

    @property
    def beyond(self) -> float:
        """The effective size of a job past everything its law has seen: all such jobs share the last queue, in
        arrival order (Tiresias' lowest queue). Ranked by attained service instead (least-attained-service), they
        would take turns, and under overload a class of jobs with a typical length would never finish: each new
        one passes the ones nearly done."""
        return grid(grid_points(self.per_octave) - 1, self.per_octave)

    def next_change(self, attained: float) -> float | None:
        """The attained service at which the answer may change next (the next grid point)."""
        k = grid_floor(attained, self.per_octave) + 1
        return grid(k, self.per_octave) if k < grid_points(self.per_octave) else None
