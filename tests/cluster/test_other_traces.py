"""Traces of other clusters than Philly: Helios' and Acme's column names, times in seconds, durations from start
and end, columns named on the command line; rows of no GPU job left out and counted; a trace that does not match
the layout refused with what to do instead."""
import json

import pytest

from sim_harness import write_table
from gmux.cli.sim import main
from gmux.cluster.sim.trace import TraceError, load_trace

# Helios' cluster_log.csv columns (SenseTime, SC'21), with a CPU-only job, a job cancelled before it ran and a
# job that ran.
HELIOS = ("job_id,user,vc,jobname,gpu_num,cpu_num,node_num,state,submit_time,start_time,end_time,duration,queue\n"
          "1,u1,vcX,a,0,4,1,COMPLETED,2020-04-01 00:00:00,2020-04-01 00:00:01,2020-04-01 00:10:00,599,1\n"
          "2,u2,vcX,b,8,32,1,CANCELLED,2020-04-01 00:00:30,,,0,0\n"
          "3,u2,vcX,c,2,8,1,COMPLETED,2020-04-01 00:01:00,2020-04-01 00:01:00,2020-04-01 01:01:00,3600,0\n"
          "4,u3,vcY,d,1,2,1,FAILED,2020-04-01 00:02:00,2020-04-01 00:03:00,2020-04-01 00:03:30,30,60\n")


def _tables(tmp_path):
    write_table(tmp_path / "gavel_throughputs.json", {("A", "B"): [0.8, 0.7]})
    (tmp_path / "vcs.csv").write_text("vc,node num\nvcX,1\nvcY,1\n")
    return ["--throughputs", str(tmp_path / "gavel_throughputs.json")]


def test_a_helios_trace_loads_its_gpu_jobs_and_counts_the_rest(tmp_path):
    (tmp_path / "t.csv").write_text(HELIOS)
    tr = load_trace(str(tmp_path / "t.csv"))
    assert [(j.line, j.submit, j.duration, j.num_gpus, j.vc) for j in tr.jobs] == \
        [(4, 0.0, 3600.0, 2, "vcX"), (5, 60.0, 30.0, 1, "vcY")]
    assert tr.skipped == {"no GPU": 1, "never ran": 1} and tr.bad_rows == []
    assert str(tr.origin) == "2020-04-01 00:01:00"


def test_seconds_and_durations_from_start_and_end(tmp_path):
    """Unix times, no duration column: end - start; a row whose end is before its start, or whose time is of the
    other kind than the first row's, is a bad row with its line."""
    (tmp_path / "t.csv").write_text("submit_time,start_time,end_time,num_gpus\n"
                                    "1600000000,1600000010,1600000110,4\n"
                                    "1600000050.5,1600000060,1600000030,1\n"
                                    "2020-09-13 12:30:00,1600000060,1600000070,1\n"
                                    "1600000100,1600000100,1600007300,8\n")
    with pytest.raises(TraceError) as e:
        load_trace(str(tmp_path / "t.csv"))
    assert "line 3: end_time is before start_time" in str(e.value)
    assert "line 4: timestamp '2020-09-13 12:30:00' is a date, the trace's first row seconds" in str(e.value)
    tr = load_trace(str(tmp_path / "t.csv"), bad_rows="skip")
    assert [(j.submit, j.duration, j.num_gpus, j.vc) for j in tr.jobs] == [(0.0, 100.0, 4, "all"),
                                                                           (100.0, 7200.0, 8, "all")]


def test_iso_times_with_a_zone_are_read_as_the_instant_they_name(tmp_path):
    (tmp_path / "t.csv").write_text("timestamp,duration,num_gpus,cluster\n"
                                    "2020-01-01T00:00:00Z,10,1,a\n2020-01-01T02:00:30+02:00,10,1,a\n")
    assert [j.submit for j in load_trace(str(tmp_path / "t.csv")).jobs] == [0.0, 30.0]


def test_columns_named_by_the_caller_and_unknown_ones_refused(tmp_path):
    (tmp_path / "t.csv").write_text("queued_at,secs,n_gpu\n2020-01-01 00:00:00,50,2\n")
    with pytest.raises(TraceError, match="lacks column.*submit.*gpus.*--columns"):
        load_trace(str(tmp_path / "t.csv"))
    tr = load_trace(str(tmp_path / "t.csv"), columns={"submit": "queued_at", "duration": "secs", "gpus": "n_gpu"})
    assert [(j.duration, j.num_gpus) for j in tr.jobs] == [(50.0, 2)]
    with pytest.raises(TraceError, match="no column 'nope'"):
        load_trace(str(tmp_path / "t.csv"), columns={"submit": "nope", "duration": "secs", "gpus": "n_gpu"})


def test_gmux_sim_runs_another_clusters_trace(tmp_path, capsys):
    tput = _tables(tmp_path)
    (tmp_path / "t.csv").write_text(HELIOS)
    out = tmp_path / "r.json"
    assert main(["--trace", str(tmp_path / "t.csv"), "--vcs", str(tmp_path / "vcs.csv"), *tput, "--policy",
                 "srtf,gmux", "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["summary"]["gmux"]["jobs"] == 2 and res["summary"]["srtf"]["avg_jct_s"] == pytest.approx(1815.0)
    printed = capsys.readouterr().out
    assert "1 no GPU" in printed and "1 never ran" in printed
    # Against Philly's layout (or none), every job would run on a made-up cluster: refused, saying what to give.
    (tmp_path / "philly_vc.csv").write_text("vc,node num\n6214e9,4\n")
    assert main(["--trace", str(tmp_path / "t.csv"), "--vcs", str(tmp_path / "philly_vc.csv"), *tput]) == 2
    assert "none of its VC(s) (vcX, vcY)" in capsys.readouterr().err
    (tmp_path / "novc.csv").write_text("submit_time,duration,gpu_num\n2020-01-01 00:00:00,10,1\n")
    assert main(["--trace", str(tmp_path / "novc.csv"), "--vcs", str(tmp_path / "vcs.csv"), *tput]) == 2
    assert "has no VC column" in capsys.readouterr().err
    assert main(["--trace", str(tmp_path / "novc.csv"), "--machines", "1", *tput, "--policy", "fifo"]) == 0


@pytest.mark.parametrize("spec,needle", [("gpus", "MEANING=COLUMN"), ("colour=x", "one of submit"),
                                         ("gpus=a,gpus=b", "once per meaning"), (",", "at least one")])
def test_gmux_sim_refuses_a_malformed_columns_option(tmp_path, capsys, spec, needle):
    tput = _tables(tmp_path)
    with pytest.raises(SystemExit) as e:
        main(["--trace", str(tmp_path / "t.csv"), *tput, "--columns", spec])
    assert e.value.code == 2 and needle in capsys.readouterr().err
