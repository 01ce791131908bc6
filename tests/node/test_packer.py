"""Packing with introspection: keep a pair only if measurement says it pays."""
from gmux.node.packer import Packer, Rates
from gmux.node.slicer import Slicer

GiB = 1 << 30
OLD = {"a": 10.0, "b": 20.0}


class Play:
    """The daemon's side, 0.1 s a step: the slicer's switches are acknowledged at once, the rates are what the
    test says, and a solo turn counts as measured once a job has been resident alone for 1 s."""

    def __init__(self, recheck=15.0):
        self.s = Slicer(0, 16 * GiB, quantum=1.0)
        self.s.add("a", 1, 4 * GiB, 0.0)
        self.s.add("b", 1, 4 * GiB, 0.0)
        self.p = Packer(margin=0.1, window=3.0, recheck=recheck)
        self.t = 0.0
        self.seen = {"a": 0, "b": 0}
        self.alone, self.alone_since, self.counted = None, 0.0, False
        self.unmeasured = set()     # jobs whose turns alone are never long enough to measure

    def run(self, solo, packed, seconds, span=3.0):
        """solo and packed: rates per job, or callables of the Play giving them."""
        got = []
        for _ in range(round(seconds * 10)):
            self.t += 0.1
            alone = next(iter(self.s.resident)) if len(self.s.resident) == 1 else None
            if alone != self.alone:
                self.alone, self.alone_since, self.counted = alone, self.t, False
            if alone not in (None, *self.unmeasured) and not self.counted and self.t - self.alone_since >= 1.0:
                self.seen[alone] += 1
                self.counted = True
            together = self.s.resident == {"a", "b"}
            now_solo = solo(self) if callable(solo) else solo
            now_packed = packed(self) if callable(packed) else packed
            rates = {j: Rates(now_solo[j], now_packed[j] if together else None, span, self.seen[j]) for j in "ab"}
            got += self.p.step(self.s, rates, self.t)
            for kind, j in self.s.tick(self.t):
                self.s.acked(j, kind, self.t)
        return got


def test_gaining_pair_is_kept_with_numbers_after_fresh_solo_turns():
    play = Play()
    out = play.run(OLD, {"a": 9.0, "b": 15.0}, 12.0)          # 0.9 + 0.75 = 1.65
    assert [d.kind for d in out] == ["trial", "keep"]
    keep = out[1]
    assert abs(keep.numbers["sum"] - 1.65) < 1e-9 and keep.numbers["fresh_solo"]
    assert keep.numbers["window_s"] >= 3.0 and keep.numbers["apart_s"] >= 1.0
    assert play.s.packs == [frozenset("ab")]
    assert "1.65" in keep.text
    assert play.run(OLD, {"a": 9.0, "b": 15.0}, 3.0) == [] and play.s.resident == {"a", "b"}


def test_interfering_pair_is_unpacked_and_not_retried_soon():
    play = Play()
    out = play.run(OLD, {"a": 5.5, "b": 11.0}, 12.0)          # 0.55 + 0.55 = 1.10: not above 1 + margin
    assert [d.kind for d in out] == ["trial", "unpack"]
    assert play.s.packs == []
    assert play.p.step(play.s, {j: Rates(10.0, None, 0.0) for j in "ab"}, 100.0) == []   # rejected: no new trial


def test_solo_rates_disturbed_before_the_window_are_caught_by_the_fresh_turns_after_it():
    """Both measured alone while the machine was busy (half speed), together once it was quiet: against the
    old solo rates the pair looks like a gain (4.5/5 + 9/10 = 1.8); against the fresh ones it is none."""
    play = Play()
    disturbed = {"a": 5.0, "b": 10.0}
    solo = lambda pl: disturbed if pl.p.packed is None else {j: max(disturbed[j], OLD[j]) for j in "ab"}
    out = play.run(solo, {"a": 4.5, "b": 9.0}, 12.0)
    assert [d.kind for d in out] == ["trial", "unpack"], [d.text for d in out]
    assert out[0].numbers["solo"] == disturbed
    assert out[1].numbers["solo"] == OLD and abs(out[1].numbers["sum"] - 0.9) < 1e-9
    assert play.s.packs == []


def test_a_member_that_gets_no_fresh_turn_is_judged_on_what_is_known_once_overdue():
    play = Play()
    play.unmeasured = {"b"}
    out = play.run(OLD, {"a": 9.0, "b": 15.0}, 20.0)
    decided = [d for d in out if d.kind in ("keep", "unpack")]
    assert len(decided) == 1 and decided[0].numbers["fresh_solo"] is False, [d.text for d in out]
    assert decided[0].numbers["apart_s"] > 3.0 + 2 * 2 * 1.0


def test_no_trial_without_measured_solo_rates_or_memory():
    s = Slicer(0, 16 * GiB)
    s.add("a", 1, 4 * GiB, 0.0)
    s.add("b", 1, None, 0.0)
    p = Packer()
    assert p.step(s, {"a": Rates(1.0, None, 0), "b": Rates(1.0, None, 0)}, 0) == []   # b's memory unknown
    s.entries["b"].mem = 4 * GiB
    assert p.step(s, {"a": Rates(1.0, None, 0), "b": Rates(None, None, 0)}, 0) == []  # b's solo unknown


def test_kept_pack_is_measured_again_from_fresh_solo_rates_and_unpacked_when_it_stops_gaining():
    play = Play(recheck=5.0)
    out = play.run(OLD, {"a": 9.0, "b": 15.0}, 8.0)           # kept at once (1.65)
    assert [d.kind for d in out] == ["trial", "keep"]
    pair = frozenset("ab")
    assert play.run(OLD, {"a": 9.0, "b": 15.0}, 2.0) == []    # not yet due
    got = []
    while not got:                                              # due within 1.5 s
        got = play.run(OLD, {"a": 9.0, "b": 15.0}, 0.1)
        assert play.t < 40.0
    (recheck,) = got
    assert recheck.kind == "recheck" and recheck.jobs == ["a", "b"] and "again" in recheck.text
    # The pack is undone while the jobs' solo rates are measured again: they take turns.
    assert play.s.packs == [] and play.p.again == {pair} and pair not in play.p.kept
    unknown = {"a": None, "b": None}
    assert play.run(unknown, unknown, 3.0) == [] and play.s.resident != set("ab")
    # Fresh solo rates (this phase is faster alone): tried together again; packed at the old rates it no longer
    # pays against them (9/30 + 15/40 = 0.675), although it did against the stale ones.
    fresh = {"a": 30.0, "b": 40.0}
    decided = play.run(fresh, {"a": 9.0, "b": 15.0}, 12.0)
    assert [d.kind for d in decided] == ["trial", "unpack"]
    gone = decided[1]
    assert gone.numbers["recheck"] and "stopped gaining" in gone.text and abs(gone.numbers["sum"] - 0.675) < 1e-9
    assert play.s.packs == [] and play.p.kept == set() and play.p.again == set()


def test_a_rechecked_pack_that_still_gains_is_kept():
    play = Play(recheck=5.0)
    out = play.run(OLD, {"a": 9.0, "b": 15.0}, 40.0)
    kinds = [d.kind for d in out]
    assert kinds[:5] == ["trial", "keep", "recheck", "trial", "keep"], kinds
    assert out[4].numbers["recheck"] and "still keeping" in out[4].text
    assert play.s.packs == [frozenset("ab")] or kinds[5:6] == ["recheck"]


def test_a_member_whose_solo_rate_is_lost_apart_ends_the_trial_once_overdue():
    """Nothing to judge against: the pair time-slices and the GPU's packer is free for other trials."""
    play = Play()
    solo = lambda pl: OLD if pl.p.packed is None else {"a": OLD["a"], "b": None}
    out = play.run(solo, {"a": 9.0, "b": 15.0}, 20.0)
    assert [d.kind for d in out] == ["trial", "unpack"], [d.text for d in out]
    gone = out[1]
    assert gone.numbers["unknown"] == ["b"] and gone.numbers["apart_s"] > 3.0 + 2 * 2 * 1.0
    assert "unjudged" in gone.text and play.s.packs == [] and play.p.trial is None
    assert frozenset("ab") in play.p.rejected
