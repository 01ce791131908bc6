"""The slicer with jobs that miss their deadlines: stop (SIGSTOP) and continue (SIGCONT) decisions, memory kept
by stopped jobs, and GPU time, on a fake clock. Jobs are played by hand or by `Play` (a job acknowledges only
at its boundaries, and never while stopped)."""
import pytest

from gmux.node.pacing import Pacing
from gmux.node.slicer import Slicer

GiB = 1 << 30
PACE = Pacing(floor=1.0, k=3.0, c=2.0)


def slicer(quantum=0.5, mem=(3 * GiB, 3 * GiB, 3 * GiB), total=10 * GiB, **kw):
    s = Slicer(0, total, quantum=quantum, pacing=PACE)
    for i, m in enumerate(mem):
        s.add("abc"[i], 1, m, 0.0, **kw)
    return s


class Play:
    """Each job computes mini-batches of `batch[job]` seconds (None: it never reaches a boundary) while it
    runs, telling the slicer its boundary count; it takes a suspend at its next boundary, a resume at once; a
    stopped job does nothing. Checks after every step that the resident memory fits the GPU."""

    def __init__(self, s, batch, dt=0.01):
        self.s, self.batch, self.dt, self.now = s, batch, dt, 0.0
        self.stopped, self.computing, self.progress, self.commands = set(), set(), {}, {}
        self.count = {}
        self.log = []

    def run(self, until):
        s = self.s
        while self.now < until:
            for kind, j in s.tick(self.now):
                self.log.append((round(self.now, 2), kind, j))
                if kind == "stop":
                    self.stopped.add(j)
                elif kind == "cont":
                    self.stopped.discard(j)
                elif kind in ("suspend", "resume"):
                    self.commands[j] = kind
            for j in sorted(self.computing - self.stopped):
                self.progress[j] = self.progress.get(j, 0.0) + self.dt
                if self._at_boundary(j):
                    self.count[j] = self.count.get(j, 0) + 1
                    s.passed(j, self.count[j], self.now)
                    if self.commands.get(j) == "suspend":
                        del self.commands[j]
                        self.computing.discard(j)
                        s.acked(j, "suspend", self.now)
            for j in [j for j, k in self.commands.items() if k == "resume" and j not in self.stopped]:
                del self.commands[j]
                self.computing.add(j)
                s.acked(j, "resume", self.now)
            mem = sum(s.entries[j].mem or 0 for j in s.resident)
            assert mem <= s.mem_total, f"resident {s.resident} exceed the GPU at t={self.now}"
            self.now = round(self.now + self.dt, 6)

    def _at_boundary(self, j):
        b = self.batch.get(j)
        if b is None:
            return False
        done = self.progress[j]
        return abs(done / b - round(done / b)) < self.dt / (2 * b)

    def used(self):
        return {j: self.s.used(j, self.now) for j in self.s.entries}


def test_a_job_that_never_reaches_a_boundary_is_time_sliced_by_stop_and_continue():
    s = slicer()
    play = Play(s, {"a": 0.05, "b": 0.05, "c": None})
    play.run(30.0)
    kinds = [k for _, k, j in play.log if j == "c"]
    assert kinds.count("suspend") == 1            # asked once; the command waits at its boundary for ever
    assert kinds.count("stop") >= 10 and kinds.count("cont") >= 10
    used = play.used()
    # Its turns are a quantum each; the deadline is paid once. Everyone keeps its share.
    for j in "abc":
        assert used[j] / play.now == pytest.approx(1 / 3, abs=0.05), used
    # GPU time adds up to the wall time: a stopped job is charged nothing, the others everything.
    assert sum(used.values()) == pytest.approx(play.now, rel=0.02), used
    assert progress_share(play, "a") > 0.3


def progress_share(play, j):
    return play.progress[j] / play.now


def test_a_stopped_job_keeps_its_memory_and_others_run_only_if_they_fit_beside_it():
    s = slicer(mem=(6 * GiB, 6 * GiB))            # two do not fit together
    assert s.tick(0.0) == [("resume", "a")]
    s.acked("a", "resume", 0.0)
    assert s.tick(0.6) == [("suspend", "a")]
    assert s.tick(1.5) == []                      # before the deadline: wait
    assert s.tick(1.7) == [("late", "a")]         # past it, but b would not fit beside a: said once, not stopped
    assert s.tick(5.0) == [] and s.stopped() == []
    assert s.used("a", 5.0) == pytest.approx(5.0)  # it holds the GPU: its wait for the boundary is its GPU time
    s.acked("a", "suspend", 5.2)                  # its boundary at last: the switch goes on as usual
    assert s.tick(5.2) == [("resume", "b")]


def test_a_re_attached_job_that_never_reaches_a_boundary_is_sliced_again():
    """After a daemon restart the slicer waited for each re-attached job to say what it was doing, and a job
    with no boundary never says anything: the GPU was never sliced again, c and a ran on and b waited for ever."""
    s = Slicer(0, 10 * GiB, quantum=0.5, pacing=PACE)
    for j, resident in (("a", True), ("b", False), ("c", True)):
        s.add(j, 1, 3 * GiB, 0.0, resident=resident, confirm=True)
    s.observed("a", "running", 0.0)
    s.observed("b", "suspended", 0.0)
    play = Play(s, {"a": 0.05, "b": 0.05, "c": None})
    play.computing = {"a", "c"}
    play.run(30.0)
    kinds = [k for _, k, j in play.log if j == "c"]
    assert kinds.count("stop") >= 10 and kinds.count("cont") >= 10, play.log[:20]
    used = play.used()
    for j in "abc":
        assert used[j] / play.now == pytest.approx(1 / 3, abs=0.05), used


def test_a_re_attached_job_that_never_started_is_waited_for_without_a_deadline():
    """A job not on the GPU when gmuxd restarted (never given it) may still be registering, and says nothing
    until it has: taken as computing after a second, it was sent a suspend it could not answer (and could be
    stopped)."""
    s = Slicer(0, 10 * GiB, quantum=0.5, pacing=PACE)
    s.add("a", 1, 3 * GiB, 0.0, confirm=True)
    s.add("b", 1, 3 * GiB, 0.0, resident=True, confirm=True)
    s.observed("b", "running", 0.5)
    assert [s.tick(t) for t in (1.0, 5.0, 60.0)] == [[], [], []] and s.pending == {"a": "confirm"}
    s.observed("a", "waiting", 61.0)                 # registered at last
    assert s.pending == {}


def test_a_continued_job_that_reaches_its_boundary_within_its_turn_resumes_at_once():
    s = slicer(quantum=1.0, mem=(3 * GiB, 3 * GiB))
    play = Play(s, {"a": 2.5, "b": 0.05})         # a's first mini-batch outlasts its turn and its deadline
    play.run(8.0)
    a = [(t, k) for t, k, j in play.log if j == "a"]
    assert [k for _, k in a[:5]] == ["resume", "suspend", "stop", "cont", "resume"], a
    cont, resume = a[3][0], a[4][0]
    assert resume - cont == pytest.approx(0.5, abs=0.05)   # at its boundary, half-way through its turn
    assert not [e for e in play.log if e[2] == "b" and cont < e[0] < resume]


def test_a_continued_job_is_stopped_again_as_soon_as_its_turn_is_over():
    s = slicer(mem=(3 * GiB, 3 * GiB))
    play = Play(s, {"a": None, "b": 0.05})
    play.run(10.0)
    a = [(t, k) for t, k, j in play.log if j == "a"]
    turns = [(t0, t1) for (t0, k0), (t1, k1) in zip(a, a[1:]) if k0 == "cont" and k1 == "stop"]
    assert len(turns) >= 3 and all(t1 - t0 == pytest.approx(0.5, abs=0.05) for t0, t1 in turns), a


def test_an_answer_that_arrives_after_the_stop_continues_the_job_to_wait_for_its_resume():
    s = slicer(mem=(3 * GiB, 3 * GiB))
    s.tick(0.0)
    s.acked("a", "resume", 0.0)
    s.tick(0.6)
    s.tick(1.7)                                   # stopped just after it suspended
    s.acked("a", "suspend", 1.72)
    assert "a" not in s.resident and s.stopped() == []
    assert ("cont", "a") in s.tick(1.73)


def test_a_job_that_may_not_be_stopped_is_waited_for():
    s = slicer(mem=(3 * GiB, 3 * GiB), stoppable=False)
    s.tick(0.0)
    s.acked("a", "resume", 0.0)
    s.tick(0.6)
    assert s.tick(1.7) == [("late", "a")]
    assert s.tick(3.0) == []


def test_a_held_job_that_may_not_be_stopped_to_let_others_run_is_stopped_all_the_same():
    """A gang's rank (or a job on GPUs of its own) is never stopped for others' turns, which would free nothing;
    held (a user's suspend, a fence) and never reaching a boundary, it trained on while said held: an unmodified
    DDP gang on a machine cut off from its scheduler trained in two places at once. And a fence's hold (a deadline
    of its own) stops even a job whose memory leaves no room beside it for the jobs waiting."""
    for stoppable, stop_by, mem in ((False, None, 3 * GiB), (True, 0.5, None)):
        s = slicer(mem=(mem, 3 * GiB), stoppable=stoppable)
        play = Play(s, {"a": None, "b": 0.05})          # a never reaches a boundary
        play.run(0.3)
        s.hold("a", stop_by=stop_by)
        play.run(3.0)
        assert "a" in s.stopped() and ("stop", "a") in [(k, j) for _, k, j in play.log], play.log
        s.release("a")
        play.run(6.0)
        assert ("cont", "a") in [(k, j) for _, k, j in play.log], play.log
    s = slicer(mem=(3 * GiB,), stoppable=False)         # not held: waited for, as before
    play = Play(s, {"a": None})
    play.run(3.0)
    assert "a" not in s.stopped()


def test_a_long_mini_batch_stretches_the_turn_instead_of_paying_a_suspend_per_step():
    s = slicer(mem=(3 * GiB, 3 * GiB))
    play = Play(s, {"a": 0.05, "b": 1.0})
    play.run(40.0)
    assert s.entries["b"].batch_s == pytest.approx(1.0, abs=0.05)   # measured from its boundaries
    steps_b = play.progress["b"] / 1.0
    suspends_b = [k for _, k, j in play.log if j == "b"].count("suspend")
    assert suspends_b <= steps_b / 1.8, (suspends_b, steps_b)     # about one suspend per c = 2 steps
    assert not [e for e in play.log if e[1] == "stop"]            # it always made its deadline
    used = play.used()
    assert used["a"] / used["b"] == pytest.approx(1.0, abs=0.15)  # stride scheduling keeps the shares


def test_a_job_stopped_by_someone_else_keeps_its_memory_and_gets_no_turns_until_it_runs_again():
    s = slicer()
    play = Play(s, {"a": 0.05, "b": 0.05, "c": 0.05})
    play.run(0.3)
    assert s.resident == {"a"}
    play.stopped.add("a")                         # SIGSTOP from outside gmux
    play.run(1.6)                                 # its suspend was sent at 0.5: the deadline passes at 1.5
    assert ("stop", "a") in [(k, j) for _, k, j in play.log]
    s.frozen("a", play.now)                       # the daemon saw it was stopped already: not its own stop
    play.run(10.0)
    assert not [e for e in play.log if e[1] == "cont" and e[2] == "a"]   # never continued by gmuxd
    assert "a" in s.resident and s.stopped() == ["a"]
    used = play.used()
    assert used["b"] == pytest.approx(used["c"], rel=0.15) and used["a"] <= 1.51   # until its deadline
    play.stopped.discard("a")                     # continued by its owner: it takes its suspend, runs again
    s.thawed("a", play.now)
    play.run(20.0)
    assert "a" not in s.stopped() and play.used()["a"] > used["a"] + 2


def test_the_time_a_job_is_stopped_never_counts_in_its_mini_batch_time():
    s = slicer(mem=(3 * GiB, 3 * GiB))
    play = Play(s, {"a": 0.6, "b": 0.05})
    while not (play.count.get("a", 0) >= 2 and "a" in play.computing and play.progress["a"] % 0.6 > 0.2):
        play.run(play.now + play.dt)
    play.stopped.add("a")                          # stopped from outside in the middle of a mini-batch ...
    play.run(play.now + 3.0)
    s.frozen("a", play.now)
    play.run(play.now + 3.0)
    play.stopped.discard("a")                      # ... for seconds, then continued
    s.thawed("a", play.now)
    play.run(play.now + 10.0)
    assert play.count["a"] >= 6
    assert s.entries["a"].batch_s == pytest.approx(0.6, abs=0.05)


def test_an_overdue_resume_is_never_sent_twice():
    """A job slow to reach its first boundary (a gang's rendezvous, a big model) was sent its resume again at every
    tick once overdue; a gang's ranks, answering the extra resumes at different boundaries, then disagreed and hung."""
    from gmux.node.slicer import Slicer
    alone = Slicer(1, 2 << 30, 60.0)
    alone.add("j1", 1.0, None, 0.0)
    sent = [c for t in (0.0, 0.5, 1.2, 3.0, 10.0, 61.0, 125.0) for c in alone.tick(t)]
    assert sent == [("resume", "j1")]
    alone.acked("j1", "resume", 126.0)
    assert alone.resident == {"j1"} and alone.tick(127.0) == []
    pair = Slicer(1, 2 << 30, 2.0)
    pair.add("a", 1.0, 1 << 20, 0.0)
    pair.add("b", 1.0, 1 << 20, 0.0)
    sent = [c for t in (0.0, 0.5, 1.5, 2.5, 3.0, 5.0, 6.0) for c in pair.tick(t)]
    assert sent.count(("resume", "a")) == 1 and ("stop", "a") in sent and ("resume", "b") in sent


def test_a_late_resume_answered_after_its_turn_is_over_is_suspended_before_the_next_job_resumes():
    """Two jobs that do not fit together; a's resume is answered only after its turn is over (a slow start on a
    loaded machine). b must not be resumed beside it: a is asked to suspend first (the end-to-end slicing test
    saw 1.2 GiB resident on a 1 GiB GPU)."""
    s = slicer(mem=(6 * GiB, 6 * GiB))
    assert s.tick(0.0) == [("resume", "a")]
    s.tick(0.6)                                   # a's turn is over before it answered: b is chosen next
    assert ("late", "a") in s.tick(1.2) + s.tick(1.7)    # overdue, and b would not fit beside it
    s.acked("a", "resume", 2.0)                   # its answer at last: it holds its memory now
    sent = s.tick(2.0)
    assert ("suspend", "a") in sent and ("resume", "b") not in sent, sent
    assert sum(s.entries[j].mem for j in s.resident) <= s.mem_total
    s.acked("a", "suspend", 2.1)
    assert ("resume", "b") in s.tick(2.1)


def test_a_job_held_for_a_move_computes_on_to_its_boundary_unless_others_need_the_gpu():
    # A move (the cluster link's suspend, to_boundary) needs the job at its boundary: stopped alone on its
    # GPU, it would reach it only when resumed, and the move would wait for ever. A user's suspend is stopped.
    for to_boundary in (True, False):
        s = slicer(mem=(3 * GiB,))
        play = Play(s, {"a": 3.0})                     # a mini-batch past its 1 s deadline
        play.run(0.5)
        s.hold("a", to_boundary=to_boundary)
        play.run(8.0)
        kinds = [k for _, k, j in play.log if j == "a"]
        if to_boundary:
            assert "stop" not in kinds and "a" not in s.resident and s.entries["a"].held, play.log
        else:
            assert "stop" in kinds and "a" in s.stopped(), play.log

    # Held for a move while another job runs: stopped so that it may; continued once nobody needs the GPU.
    s = slicer(mem=(3 * GiB, 3 * GiB))
    play = Play(s, {"a": 3.0, "b": 0.05})
    play.run(0.3)
    s.hold("a", to_boundary=True)
    play.run(3.0)
    assert "a" in s.stopped()                          # b runs; a keeps its memory, computing nothing
    s.hold("b")
    play.run(9.0)
    a = [k for _, k, j in play.log if j == "a"]
    assert a[-2:] == ["stop", "cont"] and "a" not in s.resident, play.log   # reached its boundary, suspended
    s.release("a")
    assert not s.entries["a"].to_boundary


def test_a_stopped_job_whose_resume_was_answered_is_shown_without_crashing_gmuxd():
    """A job that had passed boundaries before, stopped while its resume was out and answering it then, stays
    stopped with no command waiting. gmux ps's note for it formatted the missing wait as a number, and gmuxd
    died of the TypeError (seen once in the suite under load)."""
    from gmux.node.jobs import Job
    from gmux.node.stopping import Stopping
    pair = Slicer(1, 2 << 30, 2.0)
    pair.add("a", 1.0, 1 << 20, 0.0)
    pair.add("b", 1.0, 1 << 20, 0.0)
    sent = [c for t in (0.0, 0.5, 3.0, 5.0) for c in pair.tick(t)]
    assert ("stop", "a") in sent
    pair.acked("a", "resume", 5.1)
    assert pair.entries["a"].stopped and pair.waited("a", 5.2) is None
    job = Job("a", "t", "a", ["x"])
    job.boundaries = 3
    Stopping(None).note(pair, job, 5.2)
    assert job.detail == "stopped, keeps 1.0MiB"


def test_a_stopped_job_of_unknown_size_is_not_said_to_keep_nothing():
    """A job alone on its GPU that misses a user's suspend is stopped before its size is known (a Trainer that
    evaluates after every step has no boundary); gmux ps said it kept 0B."""
    from gmux.node.jobs import Job
    from gmux.node.stopping import Stopping
    alone = Slicer(1, 2 << 30, 2.0)
    alone.add("a", 1.0, None, 0.0)
    assert alone.tick(0.0) == [("resume", "a")]
    alone.acked("a", "resume", 0.1)
    alone.hold("a")
    sent = [c for t in (0.2, 0.5, 2.0) for c in alone.tick(t)]
    assert sent == [("suspend", "a"), ("stop", "a")], sent
    job = Job("a", "t", "a", ["x"])
    Stopping(None).note(alone, job, 5.2)
    assert "keeps its memory (size not known)" in job.detail and "0B" not in job.detail, job.detail


class _Node:
    """What Stopping needs of gmuxd: a supervisor whose signals see what the table held at that moment."""

    def __init__(self, alive=True):
        self.saved, self.at_signal, self.alive = {}, [], alive
        self.store = type("Store", (), {"save": lambda _, job: self.saved.__setitem__(job.id, job.stopped_by_gmux)})()
        self.sup = type("Sup", (), {"stopped_outside": lambda _, job: False, "stop": self._stop})()
        self.commands = type("Commands", (), {"settle": lambda *_: None})()
        self.decided = []

    def _stop(self, job):
        self.at_signal.append(self.saved.get(job.id))
        return self.alive

    def decide(self, *args):
        self.decided.append(args)


@pytest.mark.parametrize("alive", [True, False])
def test_the_table_says_gmuxd_stopped_a_job_before_the_signal_is_sent(alive):
    """gmuxd saved 'stopped by gmuxd' only after the SIGSTOP: killed between the two, it left the job stopped
    with a table saying nobody stopped it, and its successor took it for frozen from outside and never ran it."""
    from gmux.node.jobs import Job
    from gmux.node.stopping import Stopping
    s = slicer(mem=(1 * GiB,))
    assert s.tick(0.0) == [("resume", "a")]
    node = _Node(alive)
    job = Job("a", "t", "a", ["x"])
    Stopping(node).carry_out(s, "stop", job, 5.0)
    assert node.at_signal == [True]
    assert node.saved["a"] is alive and job.stopped_by_gmux is alive and job.stops == int(alive)
    assert bool(node.decided) is alive


def test_a_job_alone_that_reaches_no_boundary_shows_as_computing_once_overdue():
    """gmux ps showed such a job `resuming` for its whole run: its start is acknowledged at its first boundary,
    and only a job once stopped and continued counted as computing in its turn."""
    s = Slicer(0, 10 * GiB, quantum=0.5, pacing=PACE)
    s.add("a", 1, None, 0.0)
    assert s.tick(0.0) == [("resume", "a")]
    assert not s.continued("a", starting=True)       # within its deadline: still starting
    assert s.tick(PACE.floor + 0.1) == [] and s.continued("a", starting=True) and s.busy_with("a") == "resume"
    # A job that ran before, whose resume is overdue, may still be copying its state in: not shown computing
    assert not s.continued("a")
    s.acked("a", "resume", 9.0)                      # a boundary at last
    assert not s.continued("a", starting=True)


def test_a_hold_with_a_deadline_of_its_own_stops_a_job_of_long_mini_batches_by_then():
    """A cluster fence's suspend: the job's own deadline (three of its 8-s mini-batches) let it train on for 24 s
    beside the copy the scheduler started elsewhere; stopped by the fence's deadline, it does not."""
    s = slicer(mem=(3 * GiB,))
    play = Play(s, {"a": 8.0})
    play.run(20.0)                                   # three boundaries: its mini-batch time is measured
    assert s.entries["a"].batch_s == pytest.approx(8.0, abs=0.05) and s.deadline("a") >= 24
    s.hold("a", stop_by=1.0)
    held_at = play.now
    play.run(held_at + 3.0)
    stops = [t for t, kind, j in play.log if kind == "stop" and j == "a"]
    assert stops and held_at + 1.0 <= stops[0] <= held_at + 1.1, play.log[-5:]
    s.release("a")
    assert s.deadline("a") >= 24 and s.entries["a"].stop_by is None


def test_a_job_continued_from_outside_counts_its_gpu_time_again():
    """Stopped in its turn by someone else and continued, a job ran on with its GPU time stopped (an outside
    tester's: 7.9 GPU-s after 54 s alone on the GPU), and stride scheduling counted it as never running."""
    s = slicer(mem=(3 * GiB,))
    play = Play(s, {"a": 0.05})
    play.run(2.0)
    play.stopped.add("a")
    s.frozen("a", play.now)
    play.run(4.0)
    before = s.used("a", play.now)
    play.stopped.discard("a")
    s.thawed("a", play.now)
    play.run(10.0)
    assert s.used("a", play.now) == pytest.approx(before + 6.0, abs=0.1)


def test_a_job_stopped_by_someone_else_while_its_suspend_is_out_does_not_stall_the_others():
    """Found stopped from outside (SIGSTOP in its turn) after its suspend was sent but before its deadline: its
    suspend was waited for, and since a frozen job's deadline was never checked, the GPU stood idle for good
    (CI: the two other jobs made no progress in 16 s)."""
    s = slicer()
    play = Play(s, {"a": 0.07, "b": 0.05, "c": 0.05})
    play.run(0.52)
    assert s.busy_with("a") == "suspend" and "a" in play.computing
    play.stopped.add("a")
    s.frozen("a", play.now)
    play.run(10.0)
    used = play.used()
    assert used["b"] > 4 and used["c"] > 4 and used["a"] < 0.6, used
    assert "a" in s.resident and s.stopped() == ["a"]
    play.stopped.discard("a")                     # continued: it takes the suspend waiting at its boundary
    s.thawed("a", play.now)
    play.run(20.0)
    assert play.used()["a"] > used["a"] + 2, play.used()
