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


def test_kept_pack_is_measured_again_and_unpacked_when_it_stops_gaining():
    s, p, out, t = setup({"a": 9.0, "b": 15.0}, recheck=5.0, steps=35)   # kept at once (1.65)
    assert [d.kind for d in out] == ["keep"]

    def run(packed, seconds):
        nonlocal t
        got = []
        for _ in range(int(seconds * 10)):
            t += 0.1
            got += p.step(s, {j: Rates({"a": 10.0, "b": 20.0}[j], packed[j], span) for j in "ab"}, t)
            s.tick(t)
        return got
    span = 10.0
    assert run({"a": 9.0, "b": 15.0}, 4.0) == []        # not yet due
    span = 0.0                                          # the daemon restarts the windows at a recheck
    (recheck,) = run({"a": 9.0, "b": 15.0}, 1.5)
    assert recheck.kind == "recheck" and recheck.jobs == ["a", "b"] and "again" in recheck.text
    span = 3.0
    (kept,) = run({"a": 9.0, "b": 15.0}, 3.5)           # still gaining: kept, and measured again later
    assert kept.kind == "keep" and kept.numbers["recheck"] and "still keeping" in kept.text
    span = 0.0
    assert [d.kind for d in run({"a": 5.0, "b": 9.0}, 5.5)] == ["recheck"]
    span = 3.0
    (gone,) = run({"a": 5.0, "b": 9.0}, 3.5)            # 0.5 + 0.45 = 0.95: no longer pays
    assert gone.kind == "unpack" and "stopped gaining" in gone.text and abs(gone.numbers["sum"] - 0.95) < 1e-9
    assert s.packs == [] and p.kept == set()
