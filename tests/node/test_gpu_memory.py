"""A job that reaches no boundary and declared no --mem, on a real GPU: its size is read from NVML's memory per
process, so it is stopped in turns like any job without boundaries instead of holding the GPU (an in-process
gmuxd; NVML is a stand-in module here, since this machine may have no GPU)."""
import sys
import time
import types

from node_harness import GiB, register
from gmux.rundir import proc_starttime


def fake_nvml(held: dict, total=10 * GiB):
    """A pynvml that shows `held` (pid -> bytes, changed by the test) on every GPU."""
    nvml = types.ModuleType("pynvml")
    nvml.asked = 0
    nvml.nvmlInit = nvml.nvmlShutdown = lambda: None
    nvml.nvmlDeviceGetHandleByIndex = lambda i: i

    def processes(_):
        nvml.asked += 1
        return [types.SimpleNamespace(pid=pid, usedGpuMemory=mem) for pid, mem in held.items()]
    nvml.nvmlDeviceGetComputeRunningProcesses = processes
    nvml.nvmlDeviceGetMemoryInfo = lambda _: types.SimpleNamespace(used=sum(held.values()), total=total)
    return nvml


def decided(d, kind):
    return [x for x in d.decisions if x["kind"] == kind]


def run_until(d, cond, timeout=30.0):
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, [x["text"] for x in d.decisions]
        d.tick()
        time.sleep(0.02)


def test_an_unsized_job_without_boundaries_is_measured_through_nvml_and_sliced(daemon_factory, monkeypatch):
    held = {}
    nvml = fake_nvml(held)
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    d = daemon_factory(sizes=(10 * GiB,), virtual=False)
    # x never acknowledges its start: no boundary, no size (its process: a stand-in, stopped and continued)
    x = register(d, b"x", starttime=proc_starttime(d.stand_in_pid))["job"]
    b = register(d, b"b", mem=2 * GiB)["job"]
    run_until(d, lambda: decided(d, "late"))
    assert x in decided(d, "late")[0]["jobs"] and "is not known yet" in decided(d, "late")[0]["text"]
    assert nvml.asked == 0 or not decided(d, "measured")     # nothing held yet: nothing measured
    held[d.stand_in_pid] = 3 * GiB                  # what its process holds on the GPU, as NVML shows it
    run_until(d, lambda: decided(d, "stop"))
    measured = decided(d, "measured")
    assert measured and measured[0]["jobs"] == [x] and measured[0]["numbers"]["mem"] == 3 * GiB, measured
    assert d.jobs[x].working_set() == 3 * GiB and d.slicers[0].entries[x].mem == 3 * GiB
    assert decided(d, "stop")[0]["jobs"] == [x]
    run_until(d, lambda: b in d.slicers[0].resident)   # the job waiting for the GPU runs beside what x keeps
    held[d.stand_in_pid] = 4 * GiB                  # it grew in its turn: the figure follows, never falls
    run_until(d, lambda: d.slicers[0].entries[x].mem == 4 * GiB)
    held[d.stand_in_pid] = 1 * GiB
    asked = nvml.asked
    run_until(d, lambda: nvml.asked > asked + 1)
    assert d.slicers[0].entries[x].mem == 4 * GiB and len(decided(d, "measured")) == 1


def test_on_virtual_gpus_nothing_is_asked_of_nvml(daemon_factory, monkeypatch):
    nvml = fake_nvml({})
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    d = daemon_factory(sizes=(10 * GiB,))
    register(d, b"x")
    register(d, b"b", mem=2 * GiB)
    run_until(d, lambda: decided(d, "late"))
    for _ in range(30):
        d.tick()
    assert nvml.asked == 0 and not decided(d, "measured")
