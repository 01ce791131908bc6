"""A gang's ranks carry out every command together even after one rank got a command its peers never did (gmuxd
refused a peer's checkpoint, or its requester gave up): held first-come first-served, that one command stood
before every later one on its rank, and the gang was never suspended or checkpointed again."""
import json
import os

from gmux_testkit import ROOT, run_ranks

SCRIPT = os.path.join(ROOT, "tests", "scripts", "gang_agree.py")


def _run(tmp_path, world: int, boundaries: int, schedule: dict) -> list:
    out, store = str(tmp_path / "acted"), str(tmp_path / "store")
    codes, logs = run_ranks(SCRIPT, world, tmp_path,
                            lambda r: (out, str(r), str(world), store, str(boundaries), json.dumps(schedule)))
    assert codes == [0] * world, logs
    return [json.loads(open(f"{out}.{r}").read()) for r in range(world)]


def test_a_command_one_rank_alone_got_does_not_stop_the_gang_agreeing_on_later_ones(tmp_path):
    schedule = {
        "0": {2: [["checkpoint", "alone"]],               # its peer's was refused
              4: [["suspend", "s1"]],
              7: [["checkpoint", "c2"]],                  # takes the place of the one it held alone
              10: [["suspend", "s2"], ["checkpoint", "c3"]],
              16: [["resume", "r0"]],                     # needs no agreement
              18: [["suspend", "s3"]]},
        "1": {4: [["suspend", "s1"]],
              7: [["checkpoint", "c2"]],
              10: [["checkpoint", "c3"], ["suspend", "s2"], ["resume", "r1"]],   # the same two, the other way round
              14: [["exit", "alone"]],
              18: [["suspend", "s3"]]},
    }
    r0, r1 = _run(tmp_path, 2, 20, schedule)
    # both held both by boundary 11: the checkpoint first (a suspended job still checkpoints)
    together = [[4, "suspend", "s1"], [7, "checkpoint", "c2"], [11, "checkpoint", "c3"], [12, "suspend", "s2"]]
    # A command needing no agreement goes to the runtime after the boundary's round, not instead of it: a rank
    # that skipped its round paired its later rounds with its peers' earlier ones, and the gang acted at two
    # steps (here it then hung). At boundary 12 rank 1 got its resume as the gang agreed on a suspend.
    assert r0["acted"] == together + [[16, "resume", "r0"], [18, "suspend", "s3"]]
    assert r1["acted"] == together + [[13, "resume", "r1"], [18, "suspend", "s3"]]
    # the lone checkpoint was never carried out, and the lone exit is still held, by its rank only
    assert (r0["held"], r1["held"]) == ([], ["exit"])


def test_three_ranks_act_once_the_last_of_them_holds_the_command(tmp_path):
    schedule = {"0": {1: [["suspend", "s"]]}, "1": {3: [["suspend", "s"]]}, "2": {6: [["suspend", "s"]]}}
    acted = [r["acted"] for r in _run(tmp_path, 3, 8, schedule)]
    assert acted == [[[6, "suspend", "s"]]] * 3
