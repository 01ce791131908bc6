"""The simulator benchmarks' flags are checked before they run: a bad one ended in a traceback, some of them only
after the hours the run took (a last load that cannot be built, an --out that cannot be written)."""
import importlib.util
import os
import sys

import pytest

from sim_harness import write_table

BENCHMARKS = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks")


def _benchmark(name: str):
    spec = importlib.util.spec_from_file_location(f"benchmark_{name}", os.path.join(BENCHMARKS, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(monkeypatch, module, *args):
    monkeypatch.setattr(sys, "argv", [module.__name__, *args])
    try:
        return module.main()
    except SystemExit as e:
        return e.code


@pytest.fixture
def traces(tmp_path):
    (tmp_path / "philly.csv").write_text("timestamp,duration,num_gpus,gpu_time,cluster\n"
                                         "2017-10-01 00:00:00,10,1,10,vcA\n")
    (tmp_path / "philly_vc.csv").write_text("vc,node num\nvcA,1\n")
    write_table(tmp_path / "gavel_throughputs.json", {("A", "B"): [0.8, 0.7]})
    (tmp_path / "afile").write_text("")
    return tmp_path


@pytest.mark.parametrize("name,args,said", [
    ("simulate", ["--loads", "0.5,0"], "--loads: 0 is not a finite number > 0"),
    ("simulate", ["--loads", "1,x"], "--loads: 'x' is not a number"),
    ("simulate", ["--loads", "1,1"], "a load is given twice"),
    ("simulate", ["--out", "{afile}"], "afile: a file, not a directory"),
    ("synthetic", ["--seeds", "0"], "--seeds: 0 is not a positive integer"),
    ("synthetic", ["--out", "{afile}"], "a file, not a directory"),
    ("trace_features", ["--min-jobs", "-1"], "--min-jobs: -1 is not an integer >= 0"),
    ("trace_features", ["--out", "{afile}/x.json"], "a file, not a directory"),
    ("trace_features", ["--trace", "{afile}.csv"], "afile.csv: no such file"),     # (it was "skipped", exit 0)
    ("trace_features", ["--trace", "/"], "--trace /: a directory, not a file"),
    ("sim_idle", ["--policies", "gmux,nope"], "give policies once each, from fifo,"),
    ("sim_idle", ["--vc-scale", "0"], "--vc-scale: 0 is not a finite number > 0")])
def test_a_bad_flag_is_a_usage_error(monkeypatch, capsys, traces, name, args, said):
    assert _run(monkeypatch, _benchmark(name), *(a.format(afile=traces / "afile") for a in args)) == 2
    assert said in capsys.readouterr().err


def test_every_load_is_built_before_any_is_simulated_and_a_bad_trace_is_said(monkeypatch, capsys, traces):
    simulate = _benchmark("simulate")
    monkeypatch.setattr(simulate, "simulate", lambda *a, **k: pytest.fail("simulated before every load was built"))
    assert _run(monkeypatch, simulate, "--traces", str(traces), "--loads", "1,1e9", "--out", str(traces)) == 2
    assert "x1e+09: vc_scale 1000000000.0 makes a VC of more than 100,000 machines" in capsys.readouterr().err
    features = _benchmark("trace_features")
    for rows, said in (("2017-10-01 00:00:00,nan,1,nan,vcA\n", "no usable job rows"),
                       ("2017-10-01 00:00:00,10,1,10,vcA\n", "no class (a VC and a GPU count) has 100 jobs or more")):
        (traces / "t.csv").write_text("timestamp,duration,num_gpus,gpu_time,cluster\n" + rows)
        assert _run(monkeypatch, features, "--trace", str(traces / "t.csv"), "--out", str(traces / "f.json")) == 2
        assert said in capsys.readouterr().err
    assert not (traces / "f.json").exists()
