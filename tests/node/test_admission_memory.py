"""Admission never promises more memory than a GPU has: the promise is each job's --mem, which is now also its
hard limit (gmux/job/memory/limit.py), so what admission and the slicer do with the declared sizes is what the
GPU's memory really holds. A job larger than every GPU (or than the GPU it is pinned to) is refused, naming
--mem; jobs resident on a GPU at once never declare more, in sum, than it has; a pack is made only of jobs whose
sizes are all known and fit together."""
import pytest

from gmux.node.admission import Admission
from gmux.node.inventory import Gpu
from gmux.node.jobs import Job
from gmux.node.slicer import Slicer
from gmux.wire.server import Refused

GiB = 1 << 30


class StandIn:
    def __init__(self, slicers):
        self.slicers = slicers

    def decide(self, gpu, kind, jobs, numbers, text):
        pass

    def seat(self, job, now):
        self.slicers[job.gpu].add(job.id, job.weight, job.working_set(), now)

    def leave_gpu(self, job, now):
        pass

    def migrate(self, job, gpu):
        pass


class NoStore:
    def save(self, job):
        pass


def admission(sizes):
    gpus = {i: Gpu(i, "virtual", size, True) for i, size in enumerate(sizes)}
    slicers = {i: Slicer(i, size, quantum=0.5) for i, size in enumerate(sizes)}
    return Admission(gpus, {}, slicers, NoStore(), StandIn(slicers)), slicers


def test_a_job_larger_than_its_gpu_is_refused_naming_mem():
    adm, _ = admission([8 * GiB, 16 * GiB])
    with pytest.raises(Refused, match="largest GPU has 16.0GiB; lower --mem"):
        adm.admit(Job("big", "t", "big", ["x"], mem=17 * GiB), "register")
    pinned = Job("pinned", "t", "pinned", ["x"], mem=12 * GiB)
    pinned.pinned = 0
    with pytest.raises(Refused, match="needs 12.0GiB, GPU 0 has 8.0GiB"):
        adm.admit(pinned, "register")
    fits = Job("fits", "t", "fits", ["x"], mem=12 * GiB)
    adm.admit(fits, "register")
    assert fits.gpu == 1                                   # placed only where it fits


def test_jobs_resident_at_once_never_declare_more_than_the_gpu_has():
    adm, slicers = admission([16 * GiB])
    s = slicers[0]
    mems = {"a": 10 * GiB, "b": 10 * GiB, "c": 5 * GiB, "d": None}
    for i, (name, mem) in enumerate(mems.items()):
        job = Job(name, "t", name, ["x"], mem=mem)
        adm.admit(job, "register")
        assert job.gpu == 0
        s.add(name, 1.0, mem, float(i))
    with pytest.raises(ValueError, match="do not fit"):
        s.pack(frozenset({"a", "b"}))                      # 20 GiB on a 16 GiB GPU: never promised together
    with pytest.raises(ValueError, match="do not fit"):
        s.pack(frozenset({"c", "d"}))                      # d's size is unknown: no promise can be made
    s.pack(frozenset({"a", "c"}), run_now=False)           # 15 GiB: fits
    seen = set()
    now = 10.0
    for _ in range(400):                                   # 40 s of 0.1 s ticks, every command acknowledged
        for kind, job in s.tick(now):
            if kind in ("suspend", "resume"):
                s.acked(job, kind, now + 0.01)
        resident = set(s.resident)
        seen.add(frozenset(resident))
        declared = [mems[j] for j in resident]
        assert len(resident) <= 1 or (None not in declared and sum(declared) <= 16 * GiB), resident
        now += 0.1
    assert frozenset({"a", "c"}) in seen and frozenset({"b"}) in seen and frozenset({"d"}) in seen, seen
