"""The target machine's gmuxd restarted in the middle of a move (killed and started again under its name, sooner
than the scheduler counts the machine lost). The new gmuxd knows nothing of the move its predecessor's link was
carrying: the scheduler waited 120 s for a "ready" it never sends, then had the source suspend the job and send
its checkpoint to the old, dead endpoint for 65 s more (185 s); once the checkpoint was sent, it waited for a
"started" for good. The move is given up at once: the job runs on at its source, bit-identical, never lost."""
import json
import os
import signal
import time

import pytest

from cluster_harness import Solo, paced, spawned, unpace, wait_for
from gmux.protocol import FINAL_STATES

STEPS = "6000"
PROMPT_S = 40       # far below the stall this guards against (185 s), far above a move's own seconds


def _restart(c, m: str) -> None:
    c.daemons[m].send_signal(signal.SIGKILL)
    c.daemons[m].wait()
    c.start_daemon(m)


def _target(tmp_path, m: str, cjob: str, test):
    """gmuxd's record on `m` of a process of `cjob` for which `test` holds, or None."""
    from gmux.wire.daemon_client import Client
    jobs = Client(str(tmp_path / f"rt-{m}")).call("ps", all=True)["jobs"]
    return next((j for j in jobs if j["name"] == cjob and test(j)), None)


def _stopped_waiting(tmp_path, m: str, cjob: str, pid: int) -> None:
    """The job's new process on `m` stopped (SIGSTOP) once gmuxd's record says it waits for its checkpoint: it
    cannot restore, nor pass a boundary, before it is let on. (As test_migration_recovery's: stopped once its offer
    is in the inbox, then let on in short runs, each followed by a look at gmuxd's record.)"""
    inbox = tmp_path / f"rt-{m}" / "cluster-in"
    wait_for(lambda: [f for f in os.listdir(inbox) if f.startswith(f"{cjob}-") and f.endswith(".holds")], 60,
             "the target's process offering what it holds", every=0.001)
    os.kill(pid, signal.SIGSTOP)

    def waiting():
        return _target(tmp_path, m, cjob,
                       lambda j: j.get("pid") == pid and (j.get("report") or {}).get("awaiting_restore"))
    for _ in range(1000):
        if waiting():
            return
        os.kill(pid, signal.SIGCONT)
        time.sleep(0.001)
        os.kill(pid, signal.SIGSTOP)
    assert waiting(), "the target's process never said it waits for the checkpoint"


@pytest.mark.parametrize("when", ["warming", "sent"])
def test_a_move_survives_a_restart_of_its_targets_gmuxd(cluster_factory, tmp_path, when):
    c = cluster_factory(policy="gandiva")
    args = (STEPS, "--batch", "36", *paced(tmp_path, "0.003"), "--frozen-mib", "0.25")
    ref = Solo(tmp_path, "ref", *args)
    c.wait_machines(3)
    out = tmp_path / "moved.json"
    cjob = c.submit(str(out), *args)
    first = wait_for(lambda: (lambda j: j["state"] == "running" and j["step"] > 200 and j)(c.job(cjob)), 120,
                     "job running")
    src = first["machine"]
    dst = next(m for m in ("m1", "m2", "m3") if m != src)
    c.call("c_migrate", cjob=cjob, machine=dst, gpu=0)
    pid = spawned(tmp_path, dst, cjob)
    # The new process is held (SIGSTOP) until gmuxd is restarted: warming, before it is ready; sent, once it waits
    # for its checkpoint, before it has restored and passed a boundary (the old link would then say "started").
    if when == "warming":
        os.kill(pid, signal.SIGSTOP)
    else:
        _stopped_waiting(tmp_path, dst, cjob, pid)
        wait_for(lambda: any(d["kind"] == "migrate_sent" and d["cjob"] == cjob for d in c.ps()["decisions"]), 30,
                 "checkpoint sent", every=0.05)
    _restart(c, dst)
    os.kill(pid, signal.SIGCONT)
    back = wait_for(lambda: (lambda j: j["state"] == "running" and j)(c.job(cjob)), PROMPT_S,
                    lambda: f"the job running again: {c.job(cjob)}")
    # The move is given up (the new gmuxd knows nothing of it): the job runs on where it was, and the new
    # process on the target, re-attached by the new gmuxd, is killed as a copy of a job that left the machine.
    assert back["machine"] == src and back["local"] == first["local"], back
    assert f"migration target {dst} restarted its gmuxd" in back["detail"], back
    wait_for(lambda: not _target(tmp_path, dst, cjob, lambda j: j["state"] not in FINAL_STATES), 30,
             "the target's copy stopped")
    unpace(tmp_path)
    jobs = c.wait_done([cjob], 240)
    assert jobs[cjob]["migrations"] == 0 and jobs[cjob]["restarts"] == 0
    res = json.loads(out.read_text())
    assert res["sha256"] == ref["sha256"] and res["steps"] == int(STEPS) and res["restored_at"] == 0
    assert c.ps()["internal_errors"] == 0
