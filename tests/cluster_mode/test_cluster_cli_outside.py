"""What an outside tester of cluster mode found in gmux-scheduler's answers to its clients: a user's move of a job
onto a GPU a gang holds was taken (its new process waited on that machine for the gang's GPU, and after two
minutes its source suspended it to send its checkpoint there: the job stopped training until the gang ended),
and refusals spoke the wire's words ("gmux: c_kill: no live job ..."), not the command the user typed. The
scheduler here has no daemons: what it sends them is recorded."""
import time

import pytest

from gmux import protocol
from gmux.cluster.scheduler.state import CJob, Machine
from gmux.wire import keys
from scheduler_alone import client, scheduler_alone


@pytest.fixture
def sched(tmp_path):
    gpus = [{"index": 0, "mem_total": 8 << 30}, {"index": 1, "mem_total": 8 << 30}]
    now = time.time()
    s = scheduler_alone(
        tmp_path, {m: Machine(m, gpus, "tcp://127.0.0.1:1", last_seen=now) for m in ("m1", "m2")},
        {"c1": CJob("c1", ["python", "train.py"], "/", state="running", machine="m1", gpu=0, rank_gpus=[0],
                    local="j1", owner="alice", first_run=now),
         "c2": CJob("c2", ["python", "ddp.py"], "/", gpus=2, state="running", machine="m2", gpu=0,
                    rank_gpus=[0, 1], local="j1", owner="bob", first_run=now)})
    s.state.ids_past("c2")
    yield s
    s.close()


def test_a_move_onto_a_gpu_a_gang_holds_is_refused_and_changes_nothing(sched):
    """`gmux migrate --cluster c1 --machine m2 --gpu 0` onto a GPU of gang c2 answered "moving c1 from m1 to m2
    GPU 0"; its copy on m2 waited "every GPU it fits is held by a multi-GPU job or gang" while c1 showed migrating,
    and after WARM_WAIT_S its source stopped it to send its checkpoint. A policy's move there is refused already
    (gmux.cluster.scheduler.driver); a user's is too, in the same words, before anything is sent."""
    for machine, gpu in (("m2", 0), ("m2", 1)):
        with pytest.raises(protocol.ProtocolError) as e:
            client(sched, "alice", "c_migrate", cjob="c1", machine=machine, gpu=gpu)
        assert str(e.value) == (f"migrate: c1 cannot go to m2 GPU {gpu}: GPU {gpu} of m2 holds c2; a gang shares no "
                                f"GPU (gmuxd slices each GPU on its own); it runs on at m1"), str(e.value)
    job = sched.jobs["c1"]
    assert (job.state, job.machine, job.gpu, job.move, sched.wire) == ("running", "m1", 0, {}, [])
    # The gang onto m1, where c1 runs: refused alike (a gang shares no GPU); to GPU 1 of m1, which is free, c1 goes.
    with pytest.raises(protocol.ProtocolError, match="GPU 0 of m1 holds c1; a gang shares no GPU"):
        client(sched, "bob", "c_migrate", cjob="c2", machine="m1", gpu=0)
    assert client(sched, "alice", "c_migrate", cjob="c1", machine="m1", gpu=1)["to"] == "m1"
    assert sched.wire == [("m1", "move", "c1")]


@pytest.mark.parametrize("mtype, fields, said", [
    ("c_kill", {"cjob": "nosuch"}, "kill: no live job 'nosuch'"),
    ("c_suspend", {"cjob": "nosuch"}, "suspend: no live job 'nosuch'"),
    ("c_resume", {"cjob": "c1"}, "resume: c1 is not held by its user (it is running)"),
    ("c_migrate", {"cjob": "c1", "machine": "m9", "gpu": 0}, "migrate: no GPU 0 on an up machine 'm9'"),
    ("c_kill", {"cjob": "c2"}, "kill: c2 belongs to bob, not to alice"),
    ("c_submit", {"argv": ["python", "t.py"], "cwd": "/", "ranks": 3}, "submit: --ranks 3: no machine has 3 GPUs"),
])
def test_refusals_speak_the_commands_words_not_the_wires(sched, mtype, fields, said):
    """`gmux kill --cluster ADDR nosuch` said "gmux: c_kill: no live job 'nosuch' ...": the message type on the
    wire, where the user typed kill (and c_suspend, c_resume, c_migrate, c_submit alike)."""
    with pytest.raises(protocol.ProtocolError) as e:
        client(sched, "alice", mtype, **fields)
    assert str(e.value).startswith(said), str(e.value)


@pytest.mark.parametrize("after", ["start_failed", "the kill alone"])
def test_a_kill_once_a_moves_checkpoint_is_sent_kills_the_copy_at_its_source_too(sched, after):
    """`gmux kill --cluster c4` while c4's checkpoint had been sent to a target that had not restored it yet
    (waiting there for a GPU): the kill went to the target alone; its copy there ended, the move was given up
    with "migration target m2 failed: killed", and the source was told to resume the job, which trained on
    (125 steps here) until the scheduler saw it had not heard the kill and sent it there, 10 s later."""
    job = sched.jobs["c1"]
    job.state, job.machine, job.source, job.source_gpus = "migrating", "m2", "m1", [0]
    job.gpu, job.rank_gpus = 1, [1]
    job.move = {"stage": "sent", "since": time.monotonic(), "target": "m2", "endpoint": "tcp://127.0.0.1:1",
                "xfer": "c1-m1-1", "was": "running"}
    assert client(sched, "alice", "c_kill", cjob="c1") == {"cjob": "c1"}
    assert sorted(sched.wire) == [("m1", "kill", "c1"), ("m2", "kill", "c1")]
    if after == "start_failed":
        sched._daemon_node_event("m2", b"m2", {"cjob": "c1", "event": "start_failed",
                                               "detail": "killed: killed through the cluster"}, None)
        assert job.machine == "m1" and job.detail.startswith("killing it: "), job.detail
    assert not [w for w in sched.wire if w[1] == "resume"], sched.wire


def test_a_value_the_wire_refuses_is_named_by_the_commands_argument(tmp_path):
    """`gmux migrate --cluster ADDR c1 --machine 'm<ESC>1' --gpu 0` said "gmux: c_migrate.machine: ... is not a
    valid name", and `gmux kill --cluster ADDR 'c<ESC>1'` "c_kill.cjob: ...": the wire's message and field, where the
    node CLI names the option typed. Refused before anything is sent (no scheduler answers here)."""
    import json
    import subprocess
    from cluster_harness import PY, ROOT, env
    keydir = str(tmp_path / "keys")
    keys.create(keydir, "scheduler")
    keys.create(keydir, "client", "tester")
    base = ["--cluster", "tcp://127.0.0.1:9", "--keys", keydir, "--as", "tester"]
    for args, said in ((["migrate", *base, "c1", "--machine", "m\x1b[31m1", "--gpu", "0"],
                        "gmux: migrate: --machine: 'm\\x1b[31m1' is not a valid name"),
                       (["kill", *base, "c\x1b[2J1"], "gmux: kill: JOB: 'c\\x1b[2J1' is not a valid name")):
        out = subprocess.run([PY, "-m", "gmux.cli.gmux", *args], env=env(), cwd=ROOT, capture_output=True, text=True,
                             timeout=60)
        assert out.returncode == 1 and out.stderr.startswith(said), out
        out = subprocess.run([PY, "-m", "gmux.cli.gmux", "--json", *args], env=env(), cwd=ROOT, capture_output=True,
                             text=True, timeout=60)
        assert json.loads(out.stdout)["error"].startswith(said[len("gmux: "):]), out


def test_a_move_within_a_machine_is_not_said_to_show_migrating():
    """`gmux migrate --cluster ADDR c10 --machine m2 --gpu 1` of a job on m2's GPU 0 said "moving c10 from m2 to m2
    GPU 1 (gmux ps --cluster shows it migrating, then running there)"; it never shows migrating: gmuxd moves it
    at its next boundary, and it is listed on GPU 1 at once."""
    from gmux.cli.cluster_commands import moving_said
    assert moving_said({"cjob": "c10", "from": "m2", "to": "m2"}, 1) == \
        "moving c10 to GPU 1 of m2 at its next boundary (within its machine: gmux ps --cluster lists it there at once)"
    assert moving_said({"cjob": "c10", "from": "m2", "to": "m1"}, 0) == \
        "moving c10 from m2 to m1 GPU 0 (gmux ps --cluster shows it migrating, then running there)"


def test_a_released_job_resumed_by_the_policy_is_not_said_to_wait_for_its_turn(sched):
    """`gmux resume --cluster` of a held job: gmux ps --cluster said "released by root: runs in its turn" of it
    for as long as it then ran."""
    assert client(sched, "alice", "c_suspend", cjob="c1")["state"] == "held"
    assert client(sched, "alice", "c_resume", cjob="c1")["state"] == "suspended"
    sched.tick(time.time())
    job = sched.jobs["c1"]
    assert sched.wire[-1] == ("m1", "resume", "c1") and (job.state, job.detail) == ("running", ""), job.detail


def test_a_program_is_refused_by_the_cluster_submit_as_by_the_node_one(tmp_path):
    """`gmux submit --cluster ADDR -- /bin/sleep 100` was sent (`gmux submit -- /bin/sleep 100` is refused: "a
    program, not a Python script"): its start then failed on the machines three times over and it was held. A
    script not here is still sent, to be looked for where it starts."""
    from gmux.cli.submit_env import submit_cwd
    for argv, said in ((["/bin/sleep", "100"], "'/bin/sleep' is a program, not a Python script"),
                       (["/usr/bin/env", "python", "x.py"], "'/usr/bin/env' is a program, not a Python script")):
        with pytest.raises(ValueError, match=said):
            submit_cwd(argv, here=False)
    shell = tmp_path / "run"
    shell.write_text("#!/bin/sh\nsleep 1\n")
    with pytest.raises(ValueError, match="is a script for '/bin/sh', not Python"):
        submit_cwd([str(shell)], here=False)
    assert submit_cwd(["python", str(tmp_path / "elsewhere.py")], here=False)


def test_a_name_is_free_again_once_its_job_is_killed(sched):
    """`gmux kill --cluster ADDR k1; gmux submit --cluster ADDR --name k1 -- ...` was refused "your job c1 is named
    'k1' and runs on: ... end that one first", though the user just had; the kill answers before the job's machine
    has ended it (the node CLI's kill waits for that). The name then picks out the new job alone."""
    sched.jobs["c1"].name = "k1"
    assert client(sched, "alice", "c_kill", cjob="k1") == {"cjob": "c1"}
    new = client(sched, "alice", "c_submit", argv=["python", "t.py"], cwd="/", name="k1")["cjob"]
    assert new != "c1" and not sched.jobs["c1"].final
    assert client(sched, "alice", "c_suspend", cjob="k1") == {"cjob": new, "state": "held"}
    with pytest.raises(protocol.ProtocolError, match="your job .* is named 'k1' and runs on"):
        client(sched, "alice", "c_submit", argv=["python", "t.py"], cwd="/", name="k1")


def test_a_job_killed_while_its_machine_is_silent_ends_with_it_and_is_not_started_elsewhere(sched):
    """`gmux kill --cluster G3` just after its machine's gmuxd was killed (-9): the kill could not reach m2, and
    once m2 was counted lost the job was started on m1 from its checkpoint ("c19 -> m1 GPU 0,1"), restored there,
    and killed again 3.6 s later when m1's report lacked the kill. A copy the lost machine shows once it is heard
    again is killed, as the copy of a job that left it."""
    job = sched.jobs["c1"]
    sched.jobs["c2"].state = "done"                     # (m2 free: where it would have been started)
    assert client(sched, "alice", "c_kill", cjob="c1") == {"cjob": "c1"}
    assert sched.wire == [("m1", "kill", "c1")]
    sched.machines["m1"].last_seen = time.time() - 3600
    sched.tick(time.time())
    assert (job.state, job.detail) == ("killed", "killed; its machine m1 was lost before it said so"), job.detail
    assert sched.wire == [("m1", "kill", "c1")] and job.machine is None
    sched._daemon_node_report("m1", b"m1", {"name": "m1", "gpus": sched.machines["m1"].gpus,
                                            "transfer": "tcp://127.0.0.1:1",
                                            "jobs": [{"cjob": "c1", "local": "j1", "state": "running", "step": 10,
                                                      "gpu": 0, "held": False}]}, None)
    assert sched.wire == [("m1", "kill", "c1")] * 2 and job.state == "killed"


def test_a_job_being_killed_is_not_held_or_moved_and_a_second_kill_by_name_is_taken(sched):
    """Once `gmux kill --cluster k1` had given its name up, a second `gmux kill --cluster k1` said "no live job
    'k1'"; and a job being killed (its machine has not said so yet) could be held (a suspend sent to it) or moved
    (new processes started for it on another machine, while its kill ended it at the source)."""
    sched.jobs["c1"].name = "k1"
    assert client(sched, "alice", "c_kill", cjob="k1") == {"cjob": "c1"}
    assert client(sched, "alice", "c_kill", cjob="k1") == {"cjob": "c1"}
    for mtype, fields in (("c_suspend", {"cjob": "k1"}), ("c_resume", {"cjob": "c1"}),
                          ("c_migrate", {"cjob": "c1", "machine": "m1", "gpu": 1})):
        with pytest.raises(protocol.ProtocolError, match=f"{mtype[2:]}: c1 is being killed"):
            client(sched, "alice", mtype, **fields)
    assert sched.wire == [("m1", "kill", "c1")] * 2 and sched.jobs["c1"].state == "running"


def test_a_gang_moved_within_its_machine_is_told_it_moves_between_machines_only(sched):
    """With a user's move onto a gang's GPUs refused, a gang moved to other GPUs of its own machine, where another
    job ran, was told that job's GPU was in its way rather than that a gang moves between machines only."""
    sched.jobs["c3"] = CJob("c3", ["python", "train.py"], "/", state="running", machine="m2", gpu=1, rank_gpus=[1],
                            local="j3", owner="bob")
    sched.jobs["c2"].rank_gpus, sched.machines["m2"].gpus = [0, 1], [{"index": i, "mem_total": 8 << 30}
                                                                     for i in range(3)]
    with pytest.raises(protocol.ProtocolError, match="^migrate: c2 is a gang: it moves between machines only$"):
        client(sched, "bob", "c_migrate", cjob="c2", machine="m2", gpu=1)
