"""The spill policy (gmux.node.spill): pure, so driven with made-up figures."""
from gmux.node.spill import Candidate, choose

GiB = 1 << 30


def job(name, host, started=True, gang=False, refused=False, busy=False, migratable=False):
    return Candidate(name, host, started, gang, refused, busy, migratable)


def test_nothing_spills_within_the_budget():
    assert choose(4 * GiB, 4 * GiB, [job("a", 4 * GiB)]) is None


def test_the_largest_holder_spills_first_and_how_depends_on_the_job():
    d = choose(6 * GiB, 4 * GiB, [job("a", 1 * GiB), job("b", 5 * GiB)])
    assert d.job == "b" and d.command == "spill"
    assert d.numbers == {"host_held": 6 * GiB, "budget": 4 * GiB, "bytes": 5 * GiB}
    assert "spilling b to disk (host copy to a file, in its process)" in d.text
    d = choose(6 * GiB, 4 * GiB, [job("a", 1 * GiB), job("b", 5 * GiB, migratable=True)])
    assert d.job == "b" and d.command == "migrate" and "checkpoint, end its process" in d.text


def test_jobs_that_cannot_spill_are_passed_over():
    cannot = [job("empty", 0), job("new", 9 * GiB, started=False), job("rank", 9 * GiB, gang=True),
              job("said-no", 9 * GiB, refused=True), job("running", 9 * GiB, busy=True)]
    assert choose(50 * GiB, 1 * GiB, cannot) is None
    assert choose(50 * GiB, 1 * GiB, cannot + [job("ok", 1)]).job == "ok"


def test_ties_go_to_the_job_listed_first():
    assert choose(3 * GiB, 1 * GiB, [job("x", GiB), job("y", GiB)]).job == "x"
