"""Packing with introspection: keep a pair only if measurement says it pays."""
from gmux.node.packer import Packer, Rates
from gmux.node.slicer import Slicer

GiB = 1 << 30


def setup(packed_rates):
    s = Slicer(0, 16 * GiB, quantum=1.0)
    s.add("a", 1, 4 * GiB, 0.0)
    s.add("b", 1, 4 * GiB, 0.0)
    p = Packer(margin=0.1, window=3.0)
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
    for i in range(60):
        t += 0.1
        rates = {j: Rates(solo[j], packed_rates[j], t - 1.0) for j in "ab"}
        out += p.step(s, rates, t)
        s.tick(t)
    return s, p, out


def test_gaining_pair_is_kept_with_numbers():
    s, p, out = setup({"a": 9.0, "b": 15.0})          # 0.9 + 0.75 = 1.65
    assert [d.kind for d in out] == ["keep"]
    assert abs(out[0].numbers["sum"] - 1.65) < 1e-9
    assert s.packs == [frozenset("ab")]
    assert "1.65" in out[0].text


def test_interfering_pair_is_unpacked_and_not_retried_soon():
    s, p, out = setup({"a": 5.5, "b": 11.0})          # 0.55 + 0.55 = 1.10: not above 1 + margin
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
