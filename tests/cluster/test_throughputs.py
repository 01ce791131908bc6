"""The throughput table is an untrusted file: each malformed part is named, never a traceback or a rate that
misleads the engine later; a type a GPU cannot run is no choice on it."""
import json
import os

import pytest

from sim_harness import write_table
from gmux.cluster.sim.throughputs import Throughputs
from gmux.cluster.sim.trace import TraceError

SHIPPED = os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "traces", "gavel_throughputs.json")


def _broken(tmp_path, change):
    path = tmp_path / "t.json"
    write_table(path, {("A", "B"): [0.8, 0.7]})
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))
    return str(path)


def _set(section, key, value, partner="null"):
    def change(data):
        data[section][key][partner] = value
    return change


@pytest.mark.parametrize("change,needle", [
    (lambda d: d.update(v100=[1, 2]), "v100: expected an object of job types, got list"),
    (lambda d: d["v100"].update({"('A', 1)": [10.0]}), "v100: ('A', 1): expected an object with its solo rate"),
    (lambda d: d["v100"]["('A', 1)"].pop("null"), "v100: ('A', 1): expected an object with its solo rate"),
    (_set("v100", "('A', 1)", "fast"), "v100: ('A', 1): solo: 'fast' is not a throughput"),
    (_set("v100", "('A', 1)", float("inf")), "v100: ('A', 1): solo: inf is not a throughput"),
    (_set("v100", "('A', 1)", -1.0), "v100: ('A', 1): solo: -1.0 is not a throughput"),
    (_set("v100", "('A', 1)", True), "v100: ('A', 1): solo: True is not a throughput"),
    (_set("v100", "('A', 1)", [float("nan"), 5.0], "('B', 1)"), "v100: ('A', 1) -> ('B', 1): nan is not a throughput"),
    (_set("v100", "('A', 1)", [5.0], "('B', 1)"), "v100: ('A', 1) -> ('B', 1): expected a known type and [rate, rate]"),
    (_set("v100", "('A', 1)", [5.0, 5.0], "('Z', 1)"), "expected a known type"),
    (lambda d: d["v100"].update({"('A', x)": {"null": 1.0}}), "scale 'x' is not a whole number"),
    (_set("p100", "('A', 1)", "slow"), "p100: ('A', 1): solo: 'slow' is not a throughput"),
    (lambda d: d.update(v100_unconsolidated=[]), "v100_unconsolidated: expected an object of job types"),
    (lambda d: d["v100_unconsolidated"].update({"('A', 1)": 3.0}), "v100_unconsolidated: ('A', 1): expected an object"),
    (lambda d: d["v100_unconsolidated"].update({"('A', 1)": {"null": 0}}), "('A', 1): rate 0 (a job spread"),
    (lambda d: [d["v100"][k].update(null=0.0) for k in ("('A', 1)", "('B', 1)", "('C', 1)")],
     "v100: no job type that runs at scale factor 1"),
])
def test_a_malformed_table_is_refused_naming_the_file_and_the_entry(tmp_path, change, needle):
    path = _broken(tmp_path, change)
    with pytest.raises(TraceError) as e:
        Throughputs(path)
    assert str(e.value).startswith(path + ": ") and needle in str(e.value)


def test_a_pair_where_one_job_would_stop_is_unpackable(tmp_path):
    tput = Throughputs(_broken(tmp_path, _set("v100", "('A', 1)", [0.0, 7.0], "('B', 1)")))
    assert tput.pair("('A', 1)", "('B', 1)") is None and not tput.fits("('A', 1)", "('B', 1)")
    assert tput.pair("('B', 1)", "('A', 1)").rate_a == pytest.approx(0.7)     # its own entry is measured


@pytest.mark.skipif(not os.path.isfile(SHIPPED), reason="../shared/traces/gavel_throughputs.json is not beside the checkout")
def test_every_gpu_of_the_shipped_table_loads_and_k80_leaves_out_what_it_cannot_run():
    for gpu in ("v100", "p100", "k80"):
        tput = Throughputs(SHIPPED, gpu)
        assert all(tput.by_scale[s] for s in (1, 2, 4, 8))
        assert all(0 < r <= 1 for r in tput.unconsolidated.values())
    k80 = Throughputs(SHIPPED, "k80")
    assert k80.cannot_run == [f"('ResNet-50 (batch size 128)', {s})" for s in (2, 4, 8)]
    assert not any("ResNet-50 (batch size 128)" in k for s in (2, 4, 8) for k in k80.by_scale[s])
    assert Throughputs(SHIPPED, "v100").cannot_run == []
