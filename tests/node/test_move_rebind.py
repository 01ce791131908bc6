"""Moves between real GPUs in the job's own process (gmuxd --rebind-gpus): the CUDA driver's checkpoint API
driven in the right order and put back on every failure (gmux.node.cuda_rebind), its binding laid out as the
toolkit's cuda.h lays it out, and gmuxd's move around it (gmux.node.moves) with a stand-in for the driver.
No GPU here: benchmarks/gpu/rebind_cuda.py runs the driver's calls on a real process."""
import os
import shutil
import subprocess
import sys
import threading
import time

import pytest

from gmux.node import cuda_rebind
from gmux.node.cuda_rebind import (CHECKPOINTED, FAILED, LOCKED, RUNNING, CudaDriver, DriverError, RebindError,
                                   Unavailable, rebind, uuid_bytes)
from node_harness import GiB, ask
from test_move_in_process import ack, commands, replies, seats, started, tick

MiB = 1 << 20
OLD, NEW = "GPU-00000000-0000-4000-8000-000000000000", "GPU-00000001-0000-4000-8000-000000000001"


class StandIn:
    """The driver's process states, and a record of the calls a rebind makes. `fail` names the calls that fail
    (a restore: "restore" with GPU pairs, "restore-back" without; "unlock-once": the first unlock only);
    `broken`: a failed call leaves the process FAILED; `raises`: what a failing call raises (else DriverError)."""

    def __init__(self, *fail, state=RUNNING, broken=False, raises=None):
        self.fail, self.calls, self._state, self.broken, self.raises = set(fail), [], state, broken, raises

    def _call(self, name, *args, then=None):
        self.calls.append((name, *args))
        if name in self.fail or (name == "unlock" and "unlock-once" in self.fail):
            self.fail.discard("unlock-once")
            if self.broken:
                self._state = FAILED
            raise self.raises or DriverError(f"{name} failed: CUDA_ERROR_INVALID_VALUE (1)")
        if then is not None:
            self._state = then

    def state(self, pid):
        self._call("state", pid)
        return self._state

    def lock(self, pid, timeout_ms):
        self._call("lock", pid, then=LOCKED)

    def checkpoint(self, pid):
        self._call("checkpoint", pid, then=CHECKPOINTED)

    def restore(self, pid, pairs):
        self._call("restore" if pairs else "restore-back", pid, *pairs, then=LOCKED)

    def unlock(self, pid):
        self._call("unlock", pid, then=RUNNING)

    def names(self):
        return [c[0] for c in self.calls]


def test_a_rebind_locks_checkpoints_restores_onto_the_new_gpu_and_unlocks():
    d = StandIn()
    times = rebind(d, 42, OLD, NEW)
    assert d.calls == [("state", 42), ("lock", 42), ("checkpoint", 42),
                       ("restore", 42, (uuid_bytes(OLD), uuid_bytes(NEW))), ("unlock", 42)]
    assert set(times) == {"lock_s", "checkpoint_s", "restore_s", "unlock_s"} and all(t >= 0 for t in times.values())


@pytest.mark.parametrize("fail, calls, where, says", [
    ({"state"}, ["state"], "source", "is pid 42 a CUDA process"),
    ({"lock"}, ["state", "lock"], "source", "nothing changed"),
    ({"checkpoint"}, ["state", "lock", "checkpoint", "state", "unlock"], "source", "back on its GPU"),
    ({"restore"}, ["state", "lock", "checkpoint", "restore", "state", "restore-back", "unlock"], "source",
     "onto GPU " + NEW),
    ({"restore", "restore-back"}, ["state", "lock", "checkpoint", "restore", "state", "restore-back"], "unknown",
     "its CUDA state is unknown"),
    ({"checkpoint", "unlock"}, ["state", "lock", "checkpoint", "state", "unlock"], "unknown",
     "putting it back failed"),
    ({"unlock"}, ["state", "lock", "checkpoint", "restore", "unlock", "unlock"], "unknown", "(twice)"),
])
def test_a_failed_step_puts_the_process_back_where_it_was(fail, calls, where, says):
    d = StandIn(*fail)
    with pytest.raises(RebindError) as e:
        rebind(d, 42, OLD, NEW)
    assert d.names() == calls and e.value.where == where and says in str(e.value), str(e.value)


def test_an_unlock_that_fails_once_is_tried_again_and_a_process_the_driver_failed_is_unknown():
    d = StandIn("unlock-once")
    rebind(d, 42, OLD, NEW)
    assert d.names() == ["state", "lock", "checkpoint", "restore", "unlock", "unlock"]
    d = StandIn("restore", broken=True)
    with pytest.raises(RebindError, match="state is unknown") as e:
        rebind(d, 42, OLD, NEW)
    assert e.value.where == "unknown" and d.names()[-1] == "state"


def test_any_exception_after_the_lock_still_puts_the_process_back():
    d = StandIn("restore", raises=TypeError("an initializer for ctype 'CUuuid' must be a list"))
    with pytest.raises(RebindError, match="TypeError: an initializer") as e:
        rebind(d, 42, OLD, NEW)
    assert e.value.where == "source" and d.names()[-2:] == ["restore-back", "unlock"]


def test_a_process_someone_else_is_checkpointing_is_left_alone():
    for state in (LOCKED, CHECKPOINTED):
        d = StandIn(state=state)
        with pytest.raises(RebindError, match="not running: someone else") as e:
            rebind(d, 42, OLD, NEW)
        assert d.names() == ["state"] and e.value.where == "source"


def test_uuids_are_the_drivers_sixteen_bytes_and_others_are_refused_before_any_call():
    assert uuid_bytes("GPU-5f0f3a0e-1b2c-4d5e-8f90-0123456789ab") == bytes.fromhex("5f0f3a0e1b2c4d5e8f900123456789ab")
    for bad in ("", "0", "MIG-5f0f3a0e-1b2c-4d5e-8f90-0123456789ab", "GPU-5f0f3a0e",
                "GPU-zz0f3a0e-1b2c-4d5e-8f90-0123456789ab"):
        d = StandIn()
        with pytest.raises(ValueError, match="not a whole GPU's UUID"):
            rebind(d, 42, bad, NEW)
        assert d.calls == []


def test_without_a_usable_driver_loading_says_why(monkeypatch):
    with monkeypatch.context() as m:
        m.setitem(sys.modules, "cffi", None)        # (a GPU machine's Python without it)
        with pytest.raises(Unavailable, match="cffi package is not installed"):
            CudaDriver.load()
    with pytest.raises(Unavailable, match="no CUDA driver .*libcuda-nowhere.so"):
        CudaDriver.load("libcuda-nowhere.so")
    with pytest.raises(Unavailable, match="no checkpoint API"):
        CudaDriver.load("libc.so.6")


@pytest.mark.skipif(not (shutil.which("gcc") and os.path.exists("/usr/local/cuda/include/cuda.h")),
                    reason="needs gcc and the CUDA toolkit's cuda.h")
def test_the_binding_lays_out_the_arguments_as_cuda_h_does(tmp_path):
    import cffi
    ffi = cffi.FFI()
    ffi.cdef(cuda_rebind._CDEF)
    fields = {"CUcheckpointLockArgs": ["timeoutMs"], "CUcheckpointCheckpointArgs": [],
              "CUcheckpointGpuPair": ["oldUuid", "newUuid"], "CUcheckpointRestoreArgs": ["gpuPairs", "gpuPairsCount"],
              "CUcheckpointUnlockArgs": [], "CUuuid": ["bytes"]}
    lines = []
    for struct, names in fields.items():
        lines.append(f'printf("{struct} %zu\\n", sizeof({struct}));')
        lines += [f'printf("{struct}.{n} %zu\\n", offsetof({struct}, {n}));' for n in names]
    src = tmp_path / "layout.c"
    src.write_text("#include <stdio.h>\n#include <stddef.h>\n#include <cuda.h>\nint main(void){" + "".join(lines)
                   + "return 0;}\n")
    subprocess.run(["gcc", "-I/usr/local/cuda/include", str(src), "-o", str(tmp_path / "layout")], check=True)
    theirs = dict(line.split() for line in subprocess.run([str(tmp_path / "layout")], capture_output=True,
                                                          text=True, check=True).stdout.splitlines())
    ours = {}
    for struct, names in fields.items():
        ours[struct] = str(ffi.sizeof(struct))
        ours.update({f"{struct}.{n}": str(ffi.offsetof(struct, n)) for n in names})
    assert ours == theirs


@pytest.fixture
def fake_libcuda(tmp_path):
    """fake/fake_libcuda_checkpoint.c built here: the checkpoint API's C side, logging what it is passed."""
    if not (shutil.which("gcc") and os.path.exists("/usr/local/cuda/include/cuda.h")):
        pytest.skip("needs gcc and the CUDA toolkit's cuda.h")

    def build(name):
        out = tmp_path / f"libcuda-{name}.so"      # (a path of its own: dlopen shares a loaded library's state)
        subprocess.run(["gcc", "-shared", "-fPIC", "-I/usr/local/cuda/include", "-o", str(out),
                        os.path.join(os.path.dirname(__file__), "fake", "fake_libcuda_checkpoint.c")], check=True)
        return str(out)
    return build


def calls(log):
    return [line.strip() for line in log.read_text().splitlines()]


def test_the_binding_hands_the_driver_its_arguments(fake_libcuda, tmp_path, monkeypatch):
    log = tmp_path / "calls"
    monkeypatch.setenv("FAKE_CUDA_LOG", str(log))
    rebind(CudaDriver.load(fake_libcuda("ok")), 4242, OLD, NEW)
    assert calls(log) == ["cuInit 0", "state 4242", "lock 4242 timeout=10000", "checkpoint 4242",
                          f"restore 4242 pairs=1 {uuid_bytes(OLD).hex()}->{uuid_bytes(NEW).hex()}", "unlock 4242"]


def test_the_drivers_error_is_named_and_the_process_put_back(fake_libcuda, tmp_path, monkeypatch):
    log = tmp_path / "calls"
    monkeypatch.setenv("FAKE_CUDA_LOG", str(log))
    monkeypatch.setenv("FAKE_CUDA_FAIL", "restore")
    with pytest.raises(RebindError) as e:
        rebind(CudaDriver.load(fake_libcuda("failing")), 4242, OLD, NEW)
    assert e.value.where == "source"
    assert "cuCheckpointProcessRestore failed: CUDA_ERROR_NOT_SUPPORTED (801) onto GPU " + NEW in str(e.value)
    assert calls(log)[-3:] == ["state 4242", "restore-back 4242 pairs=0", "unlock 4242"]


def test_a_driver_too_old_to_remap_is_refused(fake_libcuda, monkeypatch):
    monkeypatch.setenv("FAKE_CUDA_VERSION", "12080")
    with pytest.raises(Unavailable, match=r"supports CUDA 12\.8; .* needs CUDA 13\.0"):
        CudaDriver.load(fake_libcuda("old"))


# --- gmuxd's move around the driver ---

def asked_to_move(daemon_factory, driver, **job):
    d = daemon_factory((GiB, GiB), virtual=False, rebind=driver)
    a = started(d, b"a", mem=256 * MiB, **job)
    d.sent.clear()
    assert ask(d, "migrate", admin=d.admin, job=a["job"], gpu=1) is None
    (stop,) = commands(d, b"a")
    assert stop["kind"] == "suspend" and seats(d, a["job"]) == [(0, True, "move")]
    ack(d, b"a", a, stop, state="suspended", bytes=5 * MiB)
    return d, a


def driver_done(d, job):
    work = d.moves.rebinding[job][0]
    assert work.wait(10)
    tick(d)


def test_a_suspended_job_is_rebound_by_the_driver_and_resumes_on_the_target(daemon_factory):
    driver = StandIn()
    d, a = asked_to_move(daemon_factory, driver)
    job = d.jobs[a["job"]]
    # The driver works on a thread; meanwhile the job holds no memory on GPU 0 (its state is in host memory),
    # is busy there with the rebind, and counts on both GPUs.
    assert job.id in d.moves.rebinding and seats(d, job.id) == [(0, False, "rebind")] and job.target_gpu == 1
    assert "the CUDA driver rebinds it from GPU 0" in job.detail and not replies(d)
    driver_done(d, job.id)
    assert driver.calls == [("state", job.pid), ("lock", job.pid), ("checkpoint", job.pid),
                            ("restore", job.pid, (uuid_bytes(d.gpus[0].uuid), uuid_bytes(d.gpus[1].uuid))),
                            ("unlock", job.pid)]
    (reply,) = replies(d)
    assert reply["ok"] and reply["data"]["path"] == "in process" and reply["data"]["gpu"] == 1, reply
    (go,) = commands(d, b"a")
    assert go["kind"] == "resume" and go["args"]["env"]["CUDA_VISIBLE_DEVICES"] == d.gpus[1].uuid
    assert job.gpu == 1 and job.target_gpu is None and job.migrations == 1 and not d.slicers[0].entries
    moved = [x for x in d.decisions if x["kind"] == "moved"][-1]
    assert set(moved["numbers"]["rebind_s"]) == {"lock_s", "checkpoint_s", "restore_s", "unlock_s"}
    assert "rebound by the driver" in moved["text"]


def test_a_failed_rebind_leaves_the_job_on_its_gpu_and_its_next_move_takes_a_new_process(daemon_factory):
    driver = StandIn("restore")
    d, a = asked_to_move(daemon_factory, driver, migratable=True)
    job = d.jobs[a["job"]]
    driver_done(d, job.id)
    assert driver.names()[-3:] == ["state", "restore-back", "unlock"]
    (reply,) = replies(d)
    assert not reply["ok"] and "did not rebind it" in reply["error"] and "stays on GPU 0" in reply["error"], reply
    (go,) = commands(d, b"a")      # resumed where it was, alone there
    assert go["kind"] == "resume" and go["args"]["env"]["CUDA_VISIBLE_DEVICES"] == d.gpus[0].uuid
    assert job.gpu == 0 and job.target_gpu is None and not d.slicers[1].entries
    ack(d, b"a", a, go, state="running")
    assert not d.moves.applies(job, 1) and "its last move in its own process failed" in d.moves.refusal(job, 1)
    d.sent.clear()
    ask(d, "migrate", admin=d.admin, job=job.id, gpu=1)
    (cmd,) = commands(d, b"a")
    assert cmd["kind"] == "migrate" and d.slicers[0].busy_with(job.id) == "migrate"


def test_a_transparent_job_that_cannot_be_rebound_is_not_moved(daemon_factory):
    d = daemon_factory((GiB, GiB), virtual=False)    # no --rebind-gpus
    t = started(d, b"t", mem=256 * MiB)
    r = ask(d, "migrate", admin=d.admin, job=t["job"], gpu=1)
    assert not r["ok"] and "transparent mode" in r["error"] and "--rebind-gpus" in r["error"], r
    d = daemon_factory((GiB, GiB), virtual=False, rebind=StandIn())
    d.gpus[1].name = "another chip"
    t = started(d, b"t", mem=256 * MiB)
    r = ask(d, "migrate", admin=d.admin, job=t["job"], gpu=1)
    assert not r["ok"] and "only onto a GPU of the same chip" in r["error"], r


def test_a_job_that_ends_while_the_driver_works_is_forgotten(daemon_factory):
    driver = StandIn()
    d, a = asked_to_move(daemon_factory, driver)
    job = d.jobs[a["job"]]
    d.finish(job, "failed", 1, "killed")
    driver_done(d, job.id)
    assert not d.moves.rebinding and not d.slicers[0].entries and not d.slicers[1].entries and job.gpu == 0


def test_a_restarted_gmuxd_puts_back_a_process_its_predecessor_left_checkpointed(daemon_factory, tmp_path):
    d = daemon_factory((GiB, GiB), root=str(tmp_path / "rt"), virtual=False, rebind=StandIn())
    a = started(d, b"a", mem=256 * MiB)
    d._flush(force=True)
    for state, calls in ((CHECKPOINTED, ["state", "restore-back", "unlock"]), (LOCKED, ["state", "unlock"]),
                         (RUNNING, ["state"])):
        driver = StandIn(state=state)
        daemon_factory((GiB, GiB), root=str(tmp_path / "rt"), virtual=False, rebind=driver).close()
        assert driver.names() == calls and driver.calls[0][1] == d.jobs[a["job"]].pid


def test_a_gmuxd_restarted_without_rebind_gpus_still_puts_back_what_its_predecessor_left(daemon_factory, tmp_path,
                                                                                        caplog):
    release = threading.Event()

    class Stuck(StandIn):
        def checkpoint(self, pid):
            release.wait(10)
            super().checkpoint(pid)
    root = str(tmp_path / "rt")
    try:
        d = daemon_factory((GiB, GiB), root=root, virtual=False, rebind=Stuck())
        a = started(d, b"a", mem=256 * MiB)
        started(d, b"b", mem=256 * MiB)           # no move under way: nothing to put back
        d.sent.clear()
        ask(d, "migrate", admin=d.admin, job=a["job"], gpu=1)
        (stop,) = commands(d, b"a")
        ack(d, b"a", a, stop, state="suspended")
        assert d.moves.rebinding       # gmuxd dies here, its driver holding the process locked
        left, loads = StandIn(state=LOCKED), []
        daemon_factory((GiB, GiB), root=root, virtual=False, load_driver=lambda: loads.append(1) or left)
        assert loads == [1] and left.calls == [("state", d.jobs[a["job"]].pid), ("unlock", d.jobs[a["job"]].pid)]
        # Where the driver cannot be loaded, it says which job may be left locked, and serves the rest.
        again = daemon_factory((GiB, GiB), root=root, virtual=False)
        assert len(again.jobs) == 2
        assert f"{a['job']} was moving to GPU 1" in caplog.text and "cannot be checked" in caplog.text
    finally:
        release.set()


def test_a_suspended_job_is_rebound_too_and_a_held_one_stays_held(daemon_factory):
    driver = StandIn()
    d = daemon_factory((GiB, GiB), virtual=False, rebind=driver)
    a = started(d, b"a", mem=256 * MiB)
    ask(d, "suspend", admin=d.admin, job=a["job"])
    (stop,) = commands(d, b"a")
    ack(d, b"a", a, stop, state="suspended")
    assert ask(d, "migrate", admin=d.admin, job=a["job"], gpu=1) is None     # waits for the driver
    assert seats(d, a["job"]) == [(0, False, "rebind")]
    driver_done(d, a["job"])
    assert driver.names() == ["state", "lock", "checkpoint", "restore", "unlock"]
    (reply,) = replies(d)
    assert reply["ok"] and reply["data"]["path"] == "in process", reply
    assert seats(d, a["job"]) == [(1, False, None)] and d.jobs[a["job"]].held and not commands(d, b"a")


def test_a_suspend_asked_during_the_rebind_is_answered_at_once_and_holds_the_job_on_its_target(daemon_factory):
    d, a = asked_to_move(daemon_factory, StandIn())
    r = ask(d, "suspend", admin=d.admin, job=a["job"])
    assert r["ok"] and r["data"]["state"] == "held", r
    driver_done(d, a["job"])
    assert seats(d, a["job"]) == [(1, False, None)] and not commands(d, b"a")   # held: not resumed


def test_a_job_whose_cuda_state_is_unknown_is_held_not_resumed(daemon_factory):
    d, a = asked_to_move(daemon_factory, StandIn("restore", broken=True))
    driver_done(d, a["job"])
    (reply,) = replies(d)
    assert not reply["ok"] and "held, suspended on GPU 0" in reply["error"] and "gmux kill" in reply["error"]
    job = d.jobs[a["job"]]
    assert job.held and job.gpu == 0 and seats(d, job.id) == [(0, False, None)] and not commands(d, b"a")


def test_gmuxd_closing_waits_for_the_driver_and_records_where_the_job_went(daemon_factory, tmp_path):
    release = threading.Event()

    class Slow(StandIn):
        def checkpoint(self, pid):
            release.wait(10)
            super().checkpoint(pid)
    driver = Slow()
    d = daemon_factory((GiB, GiB), root=str(tmp_path / "rt"), virtual=False, rebind=driver)
    a = started(d, b"a", mem=256 * MiB)
    d.sent.clear()
    ask(d, "migrate", admin=d.admin, job=a["job"], gpu=1)
    (stop,) = commands(d, b"a")
    ack(d, b"a", a, stop, state="suspended")
    assert not d.moves.rebinding[a["job"]][0].done()
    threading.Timer(0.3, release.set).start()       # the driver is still at work as gmuxd closes
    d.close()       # as at SIGTERM: the rebind is not cut off, and where it left the job is written down
    assert driver.names() == ["state", "lock", "checkpoint", "restore", "unlock"]
    again = daemon_factory((GiB, GiB), root=str(tmp_path / "rt"), virtual=False, rebind=StandIn())
    # (its resume left as the move completed: the new gmuxd believes where it is once it says)
    assert again.jobs[a["job"]].gpu == 1 and [g for g, *_ in seats(again, a["job"])] == [1]


def test_the_source_gpu_sends_the_job_nothing_while_the_driver_has_it(daemon_factory):
    release = threading.Event()

    class Held(StandIn):
        def checkpoint(self, pid):
            release.wait(10)
            super().checkpoint(pid)
    d, a = asked_to_move(daemon_factory, Held())
    for _ in range(5):      # ticks: its quantum over, nothing else on GPU 0; it is not resumed there
        time.sleep(0.05)
        tick(d)
        assert not commands(d, b"a") and seats(d, a["job"]) == [(0, False, "rebind")]
    release.set()
    driver_done(d, a["job"])
    (go,) = commands(d, b"a")
    assert go["kind"] == "resume" and go["args"]["gpu"] == 1
