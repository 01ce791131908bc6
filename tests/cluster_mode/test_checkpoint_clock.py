"""When a cluster job's periodic checkpoint is due (gmux.node.checkpoint_clock)."""
from gmux.node.checkpoint_clock import CheckpointClock

RUNNING = {"state": "running", "step": 5}
WHY = "an optimizer attach() was not given (Adam) steps the job's parameters: a new pro"    # (gmuxd's ps: 64 chars)


def _ranks(*whys):
    return [{"id": f"j{i}", "report": {"movable": why is None, "unmovable": why}} for i, why in enumerate(whys)]


def test_a_checkpoint_every_period_of_a_job_past_its_first_step_that_runs_or_is_suspended():
    clock = CheckpointClock()
    clock.started("c1", 30.0, now=0.0)
    clock.started("c2", None, now=0.0)
    assert clock.due("c1", RUNNING, _ranks(None), 29.0) is None
    assert clock.due("c1", RUNNING, _ranks(None), 30.0) == 1
    assert clock.due("c1", RUNNING, _ranks(None), 59.0) is None
    assert clock.due("c1", {"state": "suspended", "step": 9}, _ranks(None), 60.0) == 2
    assert clock.due("c1", {"state": "stopped", "step": 9}, _ranks(None), 200.0) is None
    assert clock.due("c1", {"state": "running", "step": 0}, _ranks(None), 200.0) is None
    assert clock.due("c2", RUNNING, _ranks(None), 1e6) is None           # (submitted without periodic checkpoints)


def test_an_unmovable_job_is_asked_once_for_each_reason_not_every_period():
    """gmuxd refuses the checkpoint of a job its reports call unmovable, naming why: the link asked every period,
    and the scheduler logged the same action_failed every 30 s for as long as the job ran."""
    clock = CheckpointClock()
    clock.started("c1", 1.0, now=0.0)
    asked = [t for t in range(1, 11) if clock.due("c1", RUNNING, _ranks(None, WHY), float(t)) is not None]
    assert asked == [1], asked                      # the one refusal the scheduler hears, with the whole reason
    assert clock.due("c1", RUNNING, _ranks("its loader's persistent_workers were started in an", None), 11.0)
    assert clock.due("c1", RUNNING, _ranks("its loader's persistent_workers were started in an", None), 12.0) is None
    assert clock.due("c1", RUNNING, _ranks(None, None), 12.5) is not None  # movable again: taken, and then
    assert clock.due("c1", RUNNING, _ranks(None, None), 13.0) is None      # every period, as before
    assert clock.due("c1", RUNNING, _ranks(None, None), 13.5) is not None
    assert clock.due("c1", RUNNING, _ranks(None, WHY), 14.5) is not None  # the first reason again: said again
