"""`gmux ps` says how each job is controlled (the `control` figure of its report) and what that allows."""
import io

from rich.console import Console

from gmux.cli.tables import jobs_table


def _row(**job):
    base = {"id": "j1", "name": "n", "state": "running", "gpu": 0, "step": 3, "exclusive_gpus": [], "parked_gpus": []}
    buf = io.StringIO()
    Console(file=buf, width=400, color_system=None).print(jobs_table({"jobs": [dict(base, **job)]}))
    return buf.getvalue()


def test_control_column_names_the_mode_and_what_it_allows():
    assert "CONTROL" in _row()
    assert "explicit: suspend, free mem, move" in _row(report={"control": "explicit"}, migratable=True)
    gang_rank = _row(report={"control": "explicit"}, migratable=True, gang={"id": "g", "rank": 0, "size": 2})
    assert "explicit: suspend, free mem" in gang_rank and "move" not in gang_rank
    assert "optimizer hook: suspend, free mem" in _row(report={"control": "optimizer hook"})
    assert "module hook: suspend, free mem" in _row(report={"control": "module hook"})
    assert "none yet: no boundary yet" in _row(report={"control": "none yet"})
    # a Trainer's job (gmux/job/frameworks): movable where the framework's resume is exact
    assert "framework: suspend, free mem, move" in _row(report={"control": "framework"}, migratable=True)
    assert "move" not in _row(report={"control": "framework", "unmovable": "IterableDataset"})
    # an unmodified script moves to another GPU in its own process (gmux migrate without --new-process); before,
    # CONTROL and "migratable": false said it could not move at all
    hooked = _row(report={"control": "optimizer hook"}, moves_in_process=True)
    assert "optimizer hook: suspend, free mem, move GPU" in hooked
    assert "move" not in _row(report={"control": "none yet"}, moves_in_process=True)
    assert "move GPU" not in _row(report={"control": "explicit"}, migratable=True, moves_in_process=True)


def test_a_job_that_has_not_reported_shows_a_dash():
    line = [ln for ln in _row(report=None).splitlines() if "j1" in ln][0]
    assert " - " in line


def test_a_long_what_happened_is_cut_at_a_word_with_an_ellipsis():
    """It was cut at 60 characters, mid-word and silently ("(a fresh inter")."""
    detail = ("moved to GPU 1 in a new process (a fresh interpreter restored from its checkpoint, "
              "which took 2.1 s) after its turn ended on GPU 0")
    text = _row(detail=detail)
    assert "(a fresh interpreter restored from its checkpoint, which took 2.1…" in text
    assert "s) after" not in text
    assert "killed by gmux kill" in _row(detail="killed by gmux kill") and "…" not in _row(detail="short")


def test_an_ended_job_that_was_held_is_not_shown_held():
    """A job killed while held by `gmux suspend` was listed "killed (held)": its hold ended with it."""
    assert "killed (held)" not in _row(state="killed", held=True) and "killed" in _row(state="killed", held=True)
    assert "suspended (held)" in _row(state="suspended", held=True)
