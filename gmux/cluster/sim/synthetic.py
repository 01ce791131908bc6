"""Synthetic job streams unlike Philly's, to check that a policy tuned on Philly holds elsewhere.

Each shape draws (GPUs, solo duration) per arrival event from a stated law; none is fitted to a trace, each
stands for a kind of cluster a real trace may come from:
- `heavy`: mostly one-GPU jobs, lognormal durations (median 10 min, sigma 2.2): a research cluster where most
  jobs are short trials and a few run for days (the shape Helios and Philly report in aggregate).
- `exp`: exponential durations (mean 2 h): no size tells anything about the remaining time, so no
  size-based rule can gain and must not lose.
- `modal`: each GPU count has two typical lengths (one-GPU 0.5 or 6 h, two 4 or 20 h, four 12 or 48 h, eight 24
  or 72 h, each +-15%): fixed-length training runs, wide ones carrying most of the work.
- `wide`: 8-64 GPUs per job, lognormal durations (median 4 h, sigma 1.5): a cluster of large distributed jobs.
- `sweeps`: heavy-tailed bases, each arrival a burst of 1-16 jobs of one size whose durations are within ~20%
  of each other (hyperparameter sweeps, seeds).
- `teams`: the sweeps of 30 users, each member submitted some minutes after the previous one (exponential gaps,
  mean 10 min), so that different users' sweeps of one size interleave; every job names its user.
Arrivals are Poisson at the rate that loads the cluster to `load` (offered GPU-seconds per GPU-second, from the
shape's own mean); jobs of a burst are submitted 30 s apart (`teams`: its own gaps). Job types come from the
throughput table as for a trace (`assign_types`), so packing has the same measurements to go on.
"""
from __future__ import annotations

import math
import random
from datetime import datetime, timezone

from gmux.cluster.sim.throughputs import Throughputs, assign_types
from gmux.cluster.sim.trace import Trace, TraceJob

DAY = 86400.0
MODES = {1: (0.5, 6.0), 2: (4.0, 20.0), 4: (12.0, 48.0), 8: (24.0, 72.0)}     # hours


def _pick(rng: random.Random, dist) -> int:
    u, acc = rng.random(), 0.0
    for value, p in dist:
        acc += p
        if u < acc:
            return value
    return dist[-1][0]


def _heavy(rng):
    g = _pick(rng, ((1, .7), (2, .1), (4, .1), (8, .08), (16, .02)))
    return [(g, min(30 * DAY, rng.lognormvariate(math.log(600), 2.2)))]


def _exp(rng):
    return [(_pick(rng, ((1, .6), (2, .15), (4, .15), (8, .1))), rng.expovariate(1 / 7200))]


def _modal(rng):
    g = _pick(rng, ((1, .6), (2, .15), (4, .15), (8, .1)))
    return [(g, 3600 * MODES[g][rng.random() < 0.5] * rng.lognormvariate(0, 0.15))]


def _wide(rng):
    g = _pick(rng, ((8, .5), (16, .25), (32, .15), (64, .1)))
    return [(g, min(30 * DAY, rng.lognormvariate(math.log(4 * 3600), 1.5)))]


def _sweeps(rng):
    g = _pick(rng, ((1, .6), (2, .15), (4, .15), (8, .1)))
    base = min(20 * DAY, rng.lognormvariate(math.log(1800), 2.0))
    return [(g, base * rng.lognormvariate(0, 0.2)) for _ in range(rng.choice((1, 1, 1, 2, 4, 8, 16)))]


def _teams(rng):
    return _sweeps(rng), f"user{rng.randrange(USERS)}", lambda: rng.expovariate(1 / 600)


def _anonymous(draw):
    """A shape whose bursts are nobody's, submitted 30 s apart."""
    return lambda rng: (draw(rng), "", lambda: 30.0)


USERS = 30
# Each shape draws one arrival event: its jobs as (GPUs, solo duration), their user ("": unknown) and the gap
# before each member's submission.
SHAPES = {"heavy": _anonymous(_heavy), "exp": _anonymous(_exp), "modal": _anonymous(_modal),
          "wide": _anonymous(_wide), "sweeps": _anonymous(_sweeps), "teams": _teams}


def job_stream(shape: str, load: float, gpus: int, jobs: int, tput: Throughputs, seed: int = 0) -> list[TraceJob]:
    """`jobs` jobs of `shape` arriving at the rate that offers `load` x `gpus` GPU-seconds per second."""
    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}; one of {', '.join(SHAPES)}")
    if not load > 0 or gpus < 1 or jobs < 1:
        raise ValueError("need load > 0, gpus >= 1 and jobs >= 1")
    draw = SHAPES[shape]
    est = random.Random(seed + 1_000_003)                 # the shape's mean work, from its own draws
    mean = sum(sum(g * d for g, d in draw(est)[0]) for _ in range(20_000)) / 20_000
    rng = random.Random(seed)
    rate = load * gpus / mean
    out: list[TraceJob] = []
    t = 0.0
    while len(out) < jobs:
        t += rng.expovariate(rate)
        burst, user, gap = draw(rng)
        after = 0.0
        for k, (g, d) in enumerate(burst):
            if len(out) == jobs:
                break
            after += gap() if k else 0.0
            out.append(TraceJob(job_id=len(out), line=len(out) + 2, submit=t + after, duration=max(1.0, d),
                                num_gpus=g, vc=shape, user=user))
    assign_types(Trace(jobs=out, origin=datetime(2020, 1, 1, tzinfo=timezone.utc), path=f"synthetic:{shape}"),
                 tput, seed=seed)
    return out
