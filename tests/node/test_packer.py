"""Packing with introspection: keep a pair only if measurement says it pays."""
from gmux.node.packer import Packer, Rates
from gmux.node.slicer import Slicer

GiB = 1 << 30


def setup(packed_rates, recheck=15.0, steps=60):
    s = Slicer(0, 16 * GiB, quantum=1.0)
    s.add("a", 1, 4 * GiB, 0.0)
    s.add("b", 1, 4 * GiB, 0.0)
    p = Packer(margin=0.1, window=3.0, recheck=recheck)
    solo = {"a": 10.0, "b": 20.0}
    rates = {j: Rates(solo[j], None, 0.0) for j in "ab"}
    decisions = p.step(s, rates, 0.0)
    assert [d.kind for d in decisions] == ["trial"] and s.packs == [frozenset("ab")]
    # Play the switch: the pack becomes resident.
    t = 0.0
    while s.resident != {"a", "b"}:
        for kind, j in s.tick(t):
            s.acked(j, kind, t)
        t += 0.1
    out = []
    for i in range(steps):
        t += 0.1
        rates = {j: Rates(solo[j], packed_rates[j], t - 1.0) for j in "ab"}
        out += p.step(s, rates, t)
        s.tick(t)
    return s, p, out, t


def test_gaining_pair_is_kept_with_numbers():
    s, p, out, _ = setup({"a": 9.0, "b": 15.0})          # 0.9 + 0.75 = 1.65
    assert [d.kind for d in out] == ["keep"]
    assert abs(out[0].numbers["sum"] - 1.65) < 1e-9
    assert s.packs == [frozenset("ab")]
    assert "1.65" in out[0].text


def test_interfering_pair_is_unpacked_and_not_retried_soon():
    s, p, out, _ = setup({"a": 5.5, "b": 11.0})          # 0.55 + 0.55 = 1.10: not above 1 + margin
    assert [d.kind for d in out] == ["unpack"]
    assert s.packs == []
    assert p.step(s, {j: Rates(10.0, None, 0.0) for j in "ab"}, 100.0) == []   # rejected: no new trial


def test_no_trial_without_measured_solo_rates_or_memory():
    s = Slicer(0, 16 * GiB)
    s.add("a", 1, 4 * GiB, 0.0)
    s.add("b", 1, None, 0.0)
    p = Packer()
    assert p.step(s, {"a": Rates(1.0, None, 0), "b": Rates(1.0, None, 0)}, 0) == []   # b's memory unknown
    s.entries["b"].mem = 4 * GiB
    assert p.step(s, {"a": Rates(1.0, None, 0), "b": Rates(None, None, 0)}, 0) == []  # b's solo unknown


def test_kept_pack_is_measured_again_from_fresh_solo_rates_and_unpacked_when_it_stops_gaining():
    s, p, out, t = setup({"a": 9.0, "b": 15.0}, recheck=5.0, steps=35)   # kept at once (1.65)
    assert [d.kind for d in out] == ["keep"]
    pair = frozenset("ab")

    def run(solo, packed, seconds, span=3.0):
        """The daemon's view: solo None until measured afresh; packed rates while together."""
        nonlocal t
        got = []
        for _ in range(int(seconds * 10)):
            t += 0.1
            got += p.step(s, {j: Rates(solo[j], packed[j] if s.resident == set("ab") else None, span)
                              for j in "ab"}, t)
            for kind, j in s.tick(t):
                s.acked(j, kind, t)
        return got
    old = {"a": 10.0, "b": 20.0}
    assert run(old, {"a": 9.0, "b": 15.0}, 4.0) == []                  # not yet due
    got = []
    while not got:                                                      # due within 1.5 s
        got = run(old, {"a": 9.0, "b": 15.0}, 0.1)
        assert t < 40.0
    (recheck,) = got
    assert recheck.kind == "recheck" and recheck.jobs == ["a", "b"] and "again" in recheck.text
    # The pack is undone while the jobs' solo rates are measured again: they take turns.
    assert s.packs == [] and p.again == {pair} and pair not in p.kept
    unknown = {"a": None, "b": None}
    assert run(unknown, {"a": None, "b": None}, 3.0) == [] and s.resident != set("ab")
    # Fresh solo rates (this phase is faster alone): tried together again; packed at the old rates it no longer
    # pays against them (9/30 + 15/40 = 0.675), although it did against the stale ones.
    fresh = {"a": 30.0, "b": 40.0}
    decided = run(fresh, {"a": 9.0, "b": 15.0}, 6.0)
    assert [d.kind for d in decided] == ["trial", "unpack"]
    gone = decided[1]
    assert gone.numbers["recheck"] and "stopped gaining" in gone.text and abs(gone.numbers["sum"] - 0.675) < 1e-9
    assert s.packs == [] and p.kept == set() and p.again == set()


def test_a_rechecked_pack_that_still_gains_is_kept():
    s, p, out, t = setup({"a": 9.0, "b": 15.0}, recheck=5.0, steps=35)
    for _ in range(80):
        t += 0.1
        alone = s.resident != set("ab")
        solo = {"a": 10.0, "b": 20.0}
        p_out = p.step(s, {j: Rates(solo[j], None if alone else {"a": 9.0, "b": 15.0}[j], 3.0) for j in "ab"}, t)
        out += p_out
        for kind, j in s.tick(t):
            s.acked(j, kind, t)
    kinds = [d.kind for d in out]
    assert kinds[:4] == ["keep", "recheck", "trial", "keep"], kinds
    assert out[3].numbers["recheck"] and "still keeping" in out[3].text and s.packs == [frozenset("ab")]
