"""gmux-sim and the simulator benchmarks given hostile inputs an outside tester found to end in a traceback or in a
file that is not what it says: each is refused with a usage error or handled, and says so."""
import importlib.util
import json
import os
import sys

import pytest

from sim_harness import write_table
from gmux.cli.sim import main

BENCHMARKS = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks")


def _files(tmp_path, rows="2017-10-01 00:00:00,10,1,vcA\n", vcs="vc,node num\nvcA,1\n"):
    (tmp_path / "philly.csv").write_text("timestamp,duration,num_gpus,cluster\n" + rows)
    (tmp_path / "philly_vc.csv").write_text(vcs)
    write_table(tmp_path / "gavel_throughputs.json", {("A", "B"): [0.8, 0.7]})
    return tmp_path


@pytest.mark.parametrize("flag,value", [("--start", "0001-01-01T00:00:00+05:00"),
                                        ("--end", "9999-12-31T23:00:00-05:00")])
def test_a_window_date_beyond_what_utc_can_show_is_a_usage_error(tmp_path, capsys, flag, value):
    """`--start 0001-01-01T00:00:00+05:00` (year 0 in UTC) ended in an OverflowError traceback from argparse."""
    _files(tmp_path)
    with pytest.raises(SystemExit) as e:
        main(["--traces", str(tmp_path), "--policy", "fifo", flag, value])
    err = capsys.readouterr().err
    assert e.value.code == 2 and f"argument {flag}: {value!r} is not a time a date can show in UTC" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("scale", ["1e307", "1.7976931348623157e308"])
def test_a_vc_scale_whose_product_overflows_is_refused_in_words(tmp_path, capsys, scale):
    """`--vc-scale 1e307` on Philly's layout (a VC of 64 machines: 6.4e308 is no float) ended in an OverflowError
    traceback from round(inf) instead of saying the VC would be too large."""
    _files(tmp_path, vcs="vc,node num\nvcA,64\n")
    assert main(["--traces", str(tmp_path), "--policy", "fifo", "--vc-scale", scale]) == 2
    assert "makes a VC of more than 100,000 machines" in capsys.readouterr().err


def _trace_features():
    spec = importlib.util.spec_from_file_location("benchmark_trace_features",
                                                  os.path.join(BENCHMARKS, "trace_features.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_trace_features_on_a_small_trace_with_crafted_vc_names(tmp_path, monkeypatch, capsys):
    """trace_features.py on a trace where no class has a sweep of ten jobs ended in a ZeroDivisionError (the
    job-hour-weighted sibling R^2 of no class); a class of one job wrote NaN into the JSON (not JSON); and a VC
    named '[/x]' ended in rich's MarkupError, one with an escape code drove the terminal."""
    rows = "".join(f"2017-10-01 00:0{i}:00,{10 * (i + 1)},1,{vc}\n"
                   for i, vc in enumerate(["[/x]", "[/x]", "r\x1b[31mX", "a"]))
    trace = _files(tmp_path, rows) / "philly.csv"
    monkeypatch.setattr(sys, "argv", ["trace_features", "--trace", str(trace), "--min-jobs", "1",
                                      "--out", str(tmp_path / "f.json")])
    assert _trace_features().main() == 0
    out = capsys.readouterr().out
    assert "[/x]" in out and "r\\x1b[31mX" in out and "\x1b" not in out
    assert "sibling_r2=none" in out.splitlines()[-1]
    result = json.loads((tmp_path / "f.json").read_text(), parse_constant=lambda c: pytest.fail(f"{c} in JSON"))
    assert result["summary"]["sibling"] is None
    assert {r["vc"]: r["with_sibling"] for r in result["classes"]}["a"] == 0.0


BIG = "1" + "0" * 400         # an integer JSON holds and no float does
HUGE = "1" + "0" * 5000       # more digits than Python converts from text


@pytest.mark.parametrize("params,said", [
    ('{"gmux": {"factor": %s}}' % BIG, "gmux: parameter 'factor' must be a finite number"),
    ('{"tiresias": {"thresholds": [%s]}}' % BIG, "tiresias: thresholds must be numbers of GPU-seconds"),
    ('{"gmux": {"factor": %s}}' % HUGE, "--params is not JSON gmux-sim reads: Exceeds the limit")])
def test_policy_parameters_past_the_largest_float_are_a_usage_error(tmp_path, capsys, params, said):
    """--params '{"gmux": {"factor": 1e400 written out}}' (and a Tiresias threshold so) ended in an OverflowError
    traceback from math.isfinite / float(); an integer of 5,000 digits was refused without naming --params."""
    _files(tmp_path)
    policy = next(iter(json.loads(params.replace(HUGE, "0"))))
    with pytest.raises(SystemExit) as e:
        main(["--traces", str(tmp_path), "--policy", policy, "--params", params])
    err = capsys.readouterr().err
    assert e.value.code == 2 and said in err and "Traceback" not in err


@pytest.mark.parametrize("number,said", [(BIG, "solo: an integer of 401 digits is not a throughput"),
                                         (HUGE, "not JSON gmux-sim reads (Exceeds the limit")])
def test_a_throughput_table_with_an_integer_past_the_largest_float_is_refused_by_name(tmp_path, capsys, number,
                                                                                      said):
    """A throughput table whose rate is an integer of 401 digits ended in an OverflowError traceback; one of 5,000
    digits was refused without naming the file."""
    _files(tmp_path)
    table = tmp_path / "gavel_throughputs.json"
    text = table.read_text()
    table.write_text(text.replace('"null": 10.0', f'"null": {number}', 1))
    assert main(["--traces", str(tmp_path), "--policy", "fifo"]) == 2
    err = capsys.readouterr().err
    assert f"error: {table}: " in err and said in err


def test_results_file_that_a_plot_would_replace_is_refused_before_the_run(tmp_path, capsys):
    """`--json out/utilisation.png --plots out` wrote the results, then the plot over them, and exited 0: the run
    said nothing and left no results. Refused before anything is made (out/ is not left behind)."""
    _files(tmp_path)
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as e:
        main(["--traces", str(tmp_path), "--policy", "fifo", "--json", str(out / "utilisation.png"),
              "--plots", str(out)])
    assert e.value.code == 2 and "the plot would replace the results" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize("flag,value,said", [
    ("--suspend-s", "1e300", "a number of seconds from 0 to 3.156e+09 (100 years)"),
    ("--quantum-s", "4e9", "a number of seconds from 0 to 3.156e+09 (100 years)"),
    ("--copy-gbps", "1e-300", "a rate from 1e-06 to 1e+06 GB/s"),
    ("--copy-gbps", "0", "a rate from 1e-06 to 1e+06 GB/s")])
def test_a_cost_no_clock_can_count_is_a_usage_error(tmp_path, capsys, flag, value, said):
    """`--suspend-s 1e300` (or `--copy-gbps 1e-300`) ran, and reported an average JCT of 6.7e299 s for a 3-job trace:
    at that scale the clock no longer counts a 50 s job. The cost model refuses it too, for a caller of the library."""
    from gmux.cluster.sim.costs import Costs
    _files(tmp_path)
    with pytest.raises(SystemExit) as e:
        main(["--traces", str(tmp_path), "--policy", "srtf", flag, value])
    err = capsys.readouterr().err
    assert e.value.code == 2 and f"argument {flag}: {value} is not {said}" in err, err
    with pytest.raises(ValueError, match="cost suspend_s is 1e\\+300 s, more than 3.16e\\+09 s"):
        Costs(suspend_s=1e300)
    with pytest.raises(ValueError, match="copy_gbps must be from 1e-06 to 1e\\+06 GB/s, not 1e-300"):
        Costs(copy_gbps=1e-300)
