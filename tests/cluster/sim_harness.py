"""Fixtures for the cluster policy and simulator tests: a hand-made throughput table and a one-call runner."""
import json
import os

import pytest

from gmux.cluster.policies import make_policy
from gmux.cluster.sim.cluster import Costs
from gmux.cluster.sim.engine import Engine, make_machines
from gmux.cluster.sim.throughputs import Throughputs
from gmux.cluster.sim.trace import TraceJob

TRACES = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "traces"))


def write_table(path, pairs):
    """Types A, B, C at scale 1 and D at scales 2, 4, 8; `pairs` maps (a, b) -> [rate_a, rate_b] relative to solo
    (10 steps/s alone for every type); unlisted pairs do not fit ([0, 0])."""
    names = ["('A', 1)", "('B', 1)", "('C', 1)", "('D', 2)", "('D', 4)", "('D', 8)"]
    def rates(a, b):
        if (a, b) in pairs:
            return pairs[(a, b)]
        if (b, a) in pairs:
            return pairs[(b, a)][::-1]
        return [0, 0]

    table = {}
    for a in names:
        row = {"null": 10.0}
        for b in names:
            ra, rb = rates(a[2], b[2])
            row[b] = [10.0 * ra, 10.0 * rb]
        table[a] = row
    data = {"v100": table, "p100": table, "v100_unconsolidated": {n: {"null": 5.0} for n in names}}
    path.write_text(json.dumps(data))
    return str(path)


@pytest.fixture
def table(tmp_path):
    def make(pairs=None):
        pairs = pairs if pairs is not None else {("A", "B"): [0.8, 0.7], ("A", "A"): [0.6, 0.6],
                                                 ("B", "C"): [0.5, 0.4], ("D", "D"): [0.7, 0.7]}
        return Throughputs(write_table(tmp_path / "tput.json", pairs))
    return make


def job(i, submit, duration, gpus=1, jtype=None, elastic=False):
    if jtype is None:
        jtype = "('A', 1)" if gpus == 1 else f"('D', {min(8, max(s for s in (2, 4, 8) if s <= gpus))})"
    elif len(jtype) == 1:
        jtype = f"('{jtype}', 1)"
    return TraceJob(job_id=i, line=i + 2, submit=float(submit), duration=float(duration), num_gpus=gpus, vc="t",
                    job_type=jtype, elastic=elastic)


# Hand-made traces use flat switch costs, so their expected times are simple sums: 0.3 s to copy a job off its
# GPUs, 0.3 s to copy it back, 2 s to migrate it (the per-type model of costs.py has its own tests).
FLAT = Costs(suspend_s=0.3, resume_s=0.3, migrate_s=2.0)


def run(policy, jobs, tput, machines=1, per=8, check=True, costs=None, **params):
    pol = make_policy(policy, **params) if isinstance(policy, str) else policy
    eng = Engine(make_machines(machines, per), jobs, pol, tput, costs or FLAT, check=check)
    res = eng.run()
    by_id = {r[0]: r for r in res.jobs}
    return eng, res, by_id


def finish(by_id, i):
    return by_id[i][3]


def first_run(by_id, i):
    return by_id[i][2]
