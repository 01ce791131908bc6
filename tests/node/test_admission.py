"""Admission composed with a stand-in for the daemon (its narrow `Node` interface): placement, the queue and a
defragmentation, with no socket, store or process."""
from gmux.node.admission import Admission
from gmux.node.inventory import Gpu
from gmux.node.jobs import Job
from gmux.node.slicer import Slicer

GiB = 1 << 30


class StandIn:
    """What admission may ask of the daemon, recorded."""

    def __init__(self, slicers):
        self.slicers, self.decisions, self.moves = slicers, [], []

    def decide(self, gpu, kind, jobs, numbers, text):
        self.decisions.append((kind, list(jobs)))

    def seat(self, job, now):
        self.slicers[job.gpu].add(job.id, job.weight, job.working_set(), now)

    def leave_gpu(self, job, now):
        for s in self.slicers.values():
            s.remove(job.id, now)

    def migrate(self, job, gpu):
        self.moves.append((job.id, gpu))
        job.target_gpu = gpu


class NoStore:
    def save(self, job):
        pass


def setup(n=3):
    gpus = {i: Gpu(i, "virtual", 16 * GiB, True) for i in range(n)}
    slicers = {i: Slicer(i, 16 * GiB) for i in gpus}
    jobs = {}
    node = StandIn(slicers)
    return Admission(gpus, jobs, slicers, NoStore(), node), jobs, node


def new(jobs, name, gpus=1, migratable=True):
    job = Job(name, "t", name, ["x"], mem=GiB)
    job.gpus_wanted, job.registered, job.started, job.migratable = gpus, True, True, migratable
    jobs[name] = job
    return job


def test_single_gpu_jobs_spread_and_a_multi_gpu_job_waits_then_defragments():
    adm, jobs, node = setup()
    for name in ("a", "b"):
        job = new(jobs, name)
        adm.admit(job, "submit")
        node.seat(job, 0.0)
    assert sorted(jobs[n].gpu for n in "ab") == [0, 1]
    big = new(jobs, "big", gpus=2)
    adm.admit(big, "submit")
    assert big.gpu is None
    adm.enqueue(big)
    assert adm.queued("big") and "2 GPUs to itself" in big.detail
    adm.run(1.0)
    # One job moves to free a second whole GPU; both GPUs are reserved for the waiting job meanwhile.
    assert len(node.moves) == 1 and ("defrag", [node.moves[0][0], "big"]) in node.decisions
    assert sorted(g for g in range(3) if adm.reserved_for(g) == "big") == [g for g in range(3)
                                                                          if g != node.moves[0][1]]
