"""Trace loading and validation, the throughput table, the real Philly files, and the gmux-sim CLI."""
import json
import os
import stat

import numpy as np
import pytest

from sim_harness import TRACES, write_table
from gmux.cli.sim import main
from gmux.cluster.sim.metrics import render_table
from gmux.cluster.sim.plots import windows
from gmux.cluster.sim.throughputs import Throughputs, assign_types
from gmux.cluster.sim.trace import TraceError, load_trace, load_vcs, select

HEADER = "timestamp,duration,num_gpus,gpu_time,cluster\n"
GOOD = "2017-10-01 00:00:00,10,1,10,vcA\n2017-10-01 00:01:00,20,2,40,vcA\n"
BAD = "not-a-date,1,1,1,vcA\n2017-10-01 00:00:00,-5,1,-5,vcA\n2017-10-01 00:00:00,10,1.5,15,vcA\n" \
      "2017-10-01 00:00:00,10,2,99,vcA\n2017-10-01 00:00:00,10,1\n"


def _files(tmp_path, rows=GOOD, vcs="vc,node num\nvcA,1\n"):
    (tmp_path / "philly.csv").write_text(HEADER + rows)
    (tmp_path / "philly_vc.csv").write_text(vcs)
    write_table(tmp_path / "gavel_throughputs.json", {("A", "B"): [0.8, 0.7]})
    return tmp_path


def test_bad_rows_are_reported_with_line_numbers_and_refused(tmp_path):
    _files(tmp_path, GOOD + BAD)
    with pytest.raises(TraceError) as e:
        load_trace(str(tmp_path / "philly.csv"))
    msg = str(e.value)
    for line, what in ((4, "timestamp"), (5, "duration"), (6, "num_gpus"), (7, "gpu_time"), (8, "fields")):
        assert f"line {line}: " in msg and what in msg
    assert "5 bad row(s)" in msg


def test_bad_rows_can_be_skipped(tmp_path):
    _files(tmp_path, GOOD + BAD)
    tr = load_trace(str(tmp_path / "philly.csv"), bad_rows="skip")
    assert len(tr.jobs) == 2 and [ln for ln, _ in tr.bad_rows] == [4, 5, 6, 7, 8]
    assert tr.jobs[1].submit == 60.0 and tr.jobs[1].num_gpus == 2


def test_numbers_in_other_scripts_or_with_underscores_are_bad_rows(tmp_path):
    """float() reads '٣' as 3 and '1_0' as 10: such a row was not written by a cluster's logger."""
    (tmp_path / "t.csv").write_text("timestamp,duration,num_gpus,cluster\n5,10,1,a\n\u0665,10,1,a\n6,1_0,1,a\n"
                                    "7,10,\uff12,a\n8,1e1,+1,a\n", encoding="utf-8")
    tr = load_trace(str(tmp_path / "t.csv"), bad_rows="skip")
    assert [ln for ln, _ in tr.bad_rows] == [3, 4, 5]
    assert [(j.submit, j.duration, j.num_gpus) for j in tr.jobs] == [(0.0, 10.0, 1), (3.0, 10.0, 1)]
    with pytest.raises(TraceError) as e:
        load_vcs(str(_files(tmp_path, vcs="vc,node num\nvcA,\u0661\n") / "philly_vc.csv"))
    assert "is not a positive integer" in str(e.value)


def test_a_run_shorter_than_a_millisecond_is_a_bad_row_and_rounding_shows_no_negative_zero(tmp_path, capsys):
    """Ten thousand years into a trace the simulated clock cannot tell a 1e-9 s job from none: it ended as it
    arrived, its JCT 0, and every ratio to it NaN; rounding errors in the rest showed "slowed -0.00"."""
    _files(tmp_path, "0001-01-02 00:00:00,10,1,10,vcA\n9999-12-30 23:59:59,1e-9,1,1e-9,vcA\n"
                     "9999-12-30 23:59:59,0.5,2,1,vcA\n")
    tr = load_trace(str(tmp_path / "philly.csv"), bad_rows="skip")
    assert [(ln, why) for ln, why in tr.bad_rows] == \
        [(3, "duration 1e-09 s is under a millisecond, finer than any cluster times a job")]
    assert main(["--traces", str(tmp_path), "--bad-rows", "skip", "--policy", "fifo,srtf,gmux"]) == 0
    out = capsys.readouterr().out
    assert "-0.00" not in out and "nan" not in out, out


@pytest.mark.parametrize("content,problem", [
    ("", "empty"), ("a,b\n1,2\n", "lacks column"), (HEADER, "no usable job rows"),
    ("submit_time;gpu_num;duration\n0;1;10\n", "separated by semicolons: gmux-sim reads commas"),
    ("\t".join(["submit_time", "gpu_num", "duration"]) + "\n", "separated by tabs"),
    # the way out is said before the header's own names, of which a few are shown
    (",".join(f"c{i}" for i in range(100_000)) + "\n", r"--columns MEANING=NAME names another\)\. It has: c0, "
     r"c1, .*, c19, \.\.\. \(100000 in all\)$")])
def test_unusable_trace_files_are_refused(tmp_path, content, problem):
    (tmp_path / "t.csv").write_text(content)
    with pytest.raises(TraceError, match=problem):
        load_trace(str(tmp_path / "t.csv"))


def test_a_line_past_the_limit_is_refused_by_its_number_and_never_read_whole(tmp_path, monkeypatch):
    """A line of commas of gigabytes made a field per comma, exhausting memory before any check; a file of one
    binary line was read whole to find its first byte not in UTF-8."""
    from gmux.cluster.sim import lines
    monkeypatch.setattr(lines, "MAX_LINE", 1000)
    (tmp_path / "t.csv").write_text(HEADER + GOOD + "," * 5000 + "\n")
    with pytest.raises(TraceError, match="t.csv: line 4 is longer than 1,000 characters: not a line of a CSV"):
        load_trace(str(tmp_path / "t.csv"))
    (tmp_path / "v.csv").write_text("vc,node num\n" + "v" * 1001)
    with pytest.raises(TraceError, match="v.csv: line 2 is longer than 1,000"):
        load_vcs(str(tmp_path / "v.csv"))
    # read in pieces of 1,000 bytes: a character cut between two is no error, a bad byte is found on its line
    (tmp_path / "u.csv").write_bytes(("a" + "\u00e9" * 999 + "\n").encode() + b"x\n" + "\u00e9".encode()[:1])
    assert lines.first_undecodable(str(tmp_path / "u.csv")) == 3
    (tmp_path / "u.csv").write_bytes(("a" + "\u00e9" * 999).encode() + b"\xff")
    assert lines.first_undecodable(str(tmp_path / "u.csv")) == 1


def test_times_no_date_can_show_and_files_that_cannot_be_read_are_refused_by_name(tmp_path):
    (tmp_path / "t.csv").write_text("timestamp,duration,num_gpus,cluster\n1e300,10,1,a\n-1e18,10,1,a\n5,10,1,a\n")
    with pytest.raises(TraceError) as e:
        load_trace(str(tmp_path / "t.csv"))
    assert "line 2: timestamp '1e300' is not a time from 0001-01-02 to 9999-12-31 00:00 UTC" in str(e.value)
    assert "line 3: timestamp '-1e18'" in str(e.value)
    # the bounds said are the ones kept ("9999-12-31 23:59:59 is not a time between the years 1 and 9999")
    (tmp_path / "d.csv").write_text("timestamp,duration,num_gpus,cluster\n9999-12-31 23:59:59,10,1,a\n")
    with pytest.raises(TraceError, match="'9999-12-31 23:59:59' is not a time from 0001-01-02 to 9999-12-31 00:00"):
        load_trace(str(tmp_path / "d.csv"))
    for read in (load_trace, load_vcs, Throughputs):
        with pytest.raises(TraceError, match="/proc/self/mem: cannot be read"):
            read("/proc/self/mem")


def test_utilisation_series_stays_small_and_adds_up_however_long_the_jobs(tmp_path):
    """A job of 1e11 s made the engine keep an entry per hour (gigabytes, minutes); now it keeps one per
    change of the busy count, and the plotted series is coarsened to at most 10,000 buckets."""
    from gmux.cluster.policies import make_policy
    from gmux.cluster.sim.engine import Engine, make_machines
    from gmux.cluster.sim.metrics import utilisation_series
    from gmux.cluster.sim.trace import TraceJob
    _files(tmp_path)
    tput = Throughputs(str(tmp_path / "gavel_throughputs.json"))
    jobs = [TraceJob(0, 2, 0.0, 1e11, 1, "a", "A"), TraceJob(1, 3, 50.0, 7200.0, 2, "a", "B")]
    r = Engine(make_machines(1, 8), jobs, make_policy("fifo"), tput).run()
    assert len(r.busy_steps) <= 4 and r.end == 1e11
    hours, busy = utilisation_series([r])
    assert len(hours) <= 10_000 and hours[1] - hours[0] > 1
    assert busy.sum() * (hours[1] - hours[0]) * 3600 * 8 == pytest.approx(r.busy_gpu_s, rel=1e-9)


def test_vc_and_throughput_files_are_validated(tmp_path):
    (tmp_path / "v.csv").write_text("vc,node num\nx,zero\n")
    with pytest.raises(TraceError, match="line 2"):
        load_vcs(str(tmp_path / "v.csv"))
    for content, where in ((b"vc,node num\nvcA,2\nvc\xe9,1\n", "UTF-8 at line 3"),
                           (b'vc,node num\nvcA,2\n"vcB,1\n', "malformed CSV by line 3")):
        (tmp_path / "v.csv").write_bytes(content)
        with pytest.raises(TraceError, match=where):
            load_vcs(str(tmp_path / "v.csv"))
    (tmp_path / "t.json").write_text("{not json")
    with pytest.raises(TraceError, match="not valid JSON"):
        Throughputs(str(tmp_path / "t.json"))
    (tmp_path / "t.json").write_text("[" * 100000 + "]" * 100000)
    with pytest.raises(TraceError, match="nested too deeply"):
        Throughputs(str(tmp_path / "t.json"))
    (tmp_path / "t.json").write_text(json.dumps({"k80": {}}))
    with pytest.raises(TraceError, match="no GPU type 'v100'"):
        Throughputs(str(tmp_path / "t.json"))
    with open(tmp_path / "t.json", "a") as f:       # (sparse: read whole, gigabytes would exhaust memory)
        f.truncate(65 << 20)
    with pytest.raises(TraceError, match="t.json: 68,157,440 bytes, more than a throughput table's 64 MiB"):
        Throughputs(str(tmp_path / "t.json"))


def test_job_types_are_seeded_and_match_the_scale(tmp_path):
    _files(tmp_path)
    tput = Throughputs(str(tmp_path / "gavel_throughputs.json"))
    a, b = (load_trace(str(tmp_path / "philly.csv")) for _ in range(2))
    assign_types(a, tput, seed=1)
    assign_types(b, tput, seed=1)
    assert [j.job_type for j in a.jobs] == [j.job_type for j in b.jobs]
    assert a.jobs[1].job_type == "('D', 2)"
    assert len(select(a, start=30.0)) == 1 and len(select(a, end=30.0)) == 1


def test_suspect_pairs_handling(tmp_path):
    path = tmp_path / "t.json"
    write_table(path, {("A", "B"): [1.0, 0.7], ("A", "C"): [0.5, 0.5]})
    data = json.loads(path.read_text())
    data["p100"]["('A', 1)"]["('B', 1)"] = [6.0, 5.0]     # the same pair measured on P100: 0.6, 0.5
    data["p100"]["('B', 1)"]["('A', 1)"] = [5.0, 6.0]
    path.write_text(json.dumps(data))
    assert Throughputs(str(path), suspect="p100").pair("('A', 1)", "('B', 1)").rate_a == pytest.approx(0.6)
    assert Throughputs(str(path), suspect="drop").pair("('A', 1)", "('B', 1)") is None
    assert Throughputs(str(path), suspect="keep").pair("('A', 1)", "('B', 1)").rate_a == 1.0
    assert Throughputs(str(path)).pair("('A', 1)", "('C', 1)").rate_a == 0.5


def test_cli_runs_and_writes_json_and_plots(tmp_path, capsys):
    _files(tmp_path)
    out = tmp_path / "out"
    rc = main(["--traces", str(tmp_path), "--policy", "fifo,gmux", "--json", str(out / "r.json"),
               "--plots", str(out)])
    assert rc == 0
    res = json.loads((out / "r.json").read_text())
    assert res["summary"]["fifo"]["jobs"] == 2 and res["summary"]["gmux"]["avg_jct_s"] == pytest.approx(15.0)
    assert (out / "jct_cdf.png").stat().st_size > 1000 and (out / "utilisation.png").stat().st_size > 1000
    assert "avg JCT" in capsys.readouterr().out


@pytest.mark.parametrize("args,needle", [(["--policy", "nope"], "unknown policy nope"),
                                         (["--sample", "0"], "not in (0, 1]"),
                                         (["--end", "tomorrow"], "neither an offset"),
                                         (["--trace", "/nonexistent/x.csv"], "no such file"),
                                         (["--trace", ""], "--trace: an empty path"),
                                         (["--trace", "."], "trace .: a directory"),
                                         (["--json", "."], "--json .: a directory (give a file name)"),
                                         (["--json", "/proc/nope/r.json"], "cannot make /proc/nope"),
                                         (["--seed", "-1"], "--seed: -1 is not an integer >= 0"),
                                         (["--machines", "-3"], "not a positive integer"),
                                         (["--params", "{nope"], "--params is not JSON"),
                                         (["--params", '{"gmux": 3}'], "must map policy names"),
                                         (["--policy", "gmux", "--params", '{"gmux": {"nope": 1}}'],
                                          "gmux: unknown parameter 'nope'; it takes base_gpu_s,"),
                                         (["--policy", "gmux-law", "--params", '{"gmux-law": {"pack_margin": "x"}}'],
                                          "gmux-law: parameter 'pack_margin' must be a finite number, got 'x'"),
                                         (["--policy", "gmux", "--params", '{"gmux": {"min_run_s": NaN}}'],
                                          "'min_run_s' must be a finite number, got nan"),
                                         (["--policy", "gmux", "--params", '{"gmux": {"pack": "\\u001b[31m"}}'],
                                          "'pack' must be true or false, got '\\x1b[31m'"),
                                         (["--policy", "gmux-law", "--params", '{"gmux-law": {"censored": true}}'],
                                          "gmux-law: parameter 'censored' does not apply"),
                                         (["--policy", "tiresias", "--params", '{"tiresias": {"thresholds": 7}}'],
                                          "'thresholds' must be a list, got 7"),
                                         # values that overflowed, hung or crashed mid-run (fuzzed)
                                         (["--policy", "tiresias", "--params", '{"tiresias": {"thresholds": [Infinity]}}'],
                                          "finite positive numbers in increasing order, got [inf]"),
                                         (["--policy", "tiresias", "--params", '{"tiresias": {"thresholds": [NaN]}}'],
                                          "finite positive numbers in increasing order, got [nan]"),
                                         (["--policy", "tiresias", "--params", '{"tiresias": {"thresholds": ["x"]}}'],
                                          "thresholds must be numbers of GPU-seconds"),
                                         (["--policy", "gmux", "--params", '{"gmux": {"factor": 1e300}}'],
                                          "beyond any job: lower factor or levels"),
                                         (["--policy", "gmux", "--params", '{"gmux": {"levels": 100000}}'],
                                          "gmux: levels = 100000 (wanted: a whole number from 1 to 64)"),
                                         (["--policy", "gmux", "--params", '{"gmux": {"size_window": 100000000000000000000000}}'],
                                          "size_window = 100000000000000000000000 (wanted: a whole number from 30 to "
                                          "10,000,000)"),
                                         (["--policy", "gmux-law", "--params", '{"gmux-law": {"grid_per_octave": 1000000000}}'],
                                          "gmux-law: grid_per_octave = 1000000000 (wanted: a whole number from 1 to 64)"),
                                         (["--policy", "gmux", "--params", '{"gmux": {"host_scan": -1}}'],
                                          "host_scan = -1 (wanted: >= 0)"),
                                         (["--policy", "gmux", "--params", '{"gmux": {"min_run_s": -1, "sweep_quantile": 2}}'],
                                          "gmux: min_run_s = -1 (wanted: >= 0); sweep_quantile = 2 (wanted: from 0 to 1)"),
                                         (["--policy", "gandiva", "--params", '{"gandiva": {"max_units": 0}}'],
                                          "gandiva: max_units = 0 (wanted: >= 1)"),
                                         (["--policy", "gmux", "--params", "[" * 100000 + "]" * 100000],
                                          "--params is not JSON gmux-sim reads: nested too deeply"),
                                         # escape codes in a policy's name are shown escaped
                                         (["--policy", "\x1b[31mX"], "unknown policy \\x1b[31mX;"),
                                         (["--clusters", ","], "--clusters ',' names no cluster"),
                                         (["--machines", "4", "--vc-scale", "0.5"],
                                          "--vc-scale does not apply with --machines"),
                                         (["--machines", "4", "--vcs", "x.csv", "--unknown-vc", "refuse", "--clusters", "a"],
                                          "--vcs and --unknown-vc and --clusters do not apply with --machines")])
def test_cli_rejects_bad_arguments_with_a_clear_message(tmp_path, capsys, args, needle):
    _files(tmp_path)
    with pytest.raises(SystemExit) as e:
        main(["--traces", str(tmp_path)] + args)
    assert e.value.code == 2 and needle in capsys.readouterr().err


def test_cli_reports_bad_rows_and_unknown_vcs(tmp_path, capsys):
    _files(tmp_path, GOOD + BAD)
    assert main(["--traces", str(tmp_path), "--policy", "fifo"]) == 2
    assert "line 4" in capsys.readouterr().err
    _files(tmp_path, GOOD + "2017-10-01 00:00:00,10,1,10,vcZ\n")
    assert main(["--traces", str(tmp_path), "--policy", "fifo", "--unknown-vc", "refuse"]) == 2
    assert "vcZ" in capsys.readouterr().err
    assert main(["--traces", str(tmp_path), "--policy", "fifo", "--json", str(tmp_path / "r.json")]) == 0
    assert json.loads((tmp_path / "r.json").read_text())["summary"]["fifo"]["jobs"] == 3


def test_cli_shows_what_a_crafted_trace_holds_without_letting_it_drive_the_terminal(tmp_path, capsys):
    """A trace is untrusted: its VC names, header and fields reach gmux-sim's errors, notes and table title as
    escaped text, never as escape codes or rich markup, and a non-number is reported in gmux-sim's words."""
    _files(tmp_path, GOOD + "2017-10-01 00:00:00,10,\x1b[2J,10,vcA\n"
                           "2017-10-01 00:02:00,10,1,10,\x1b]0;owned\x07\n")
    assert main(["--traces", str(tmp_path), "--policy", "fifo", "--bad-rows", "skip", "--unknown-vc", "refuse"]) == 2
    err = capsys.readouterr().err
    assert "\x1b" not in err and "\x07" not in err and "\\x1b]0;owned\\x07" in err
    crafted = tmp_path / "[bogus]\x1b[31m.csv"
    crafted.write_text((tmp_path / "philly.csv").read_text())
    assert main(["--traces", str(tmp_path), "--trace", str(crafted), "--policy", "fifo", "--bad-rows", "skip",
                 "--machines", "1"]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "num_gpus '\\x1b[2J' is not a whole number >= 0" in out
    assert "gmux-sim: [bogus]\\x1b[31m.csv, 3 jobs" in out


def test_cli_runs_chosen_clusters_with_policy_parameters(tmp_path, capsys):
    """A subset of the VCs gives each the result it has in a full run (they run apart); parameters reach the
    policy, and a wrong name or parameter is an error, not a silent default."""
    _files(tmp_path, GOOD + "2017-10-01 00:00:00,30,1,30,vcB\n2017-10-01 00:00:00,30,1,30,vcZ\n",
           vcs="vc,node num\nvcA,1\nvcB,1\n")
    def jobs(*extra):
        assert main(["--traces", str(tmp_path), "--policy", "gmux", "--json", str(tmp_path / "r.json")]
                    + list(extra)) == 0
        return json.loads((tmp_path / "r.json").read_text())
    full = jobs()
    only_b = jobs("--clusters", "vcB", "--params", '{"gmux": {"sweep_quantile": 0, "min_run_s": 60}}')
    assert full["summary"]["gmux"]["jobs"] == 4 and only_b["summary"]["gmux"]["jobs"] == 1
    # The notes speak of what ran: vcZ (absent from the layout) ran in the full run only.
    assert any("vcZ" in n for n in full["notes"]) and not any("vcZ" in n for n in only_b["notes"])
    assert "only VC(s) vcB: 1 of 4 jobs" in only_b["notes"]
    assert only_b["summary"]["gmux"]["avg_jct_s"] == pytest.approx(30.0)
    assert main(["--traces", str(tmp_path), "--policy", "gmux", "--clusters", "vcC"]) == 2
    assert "no cluster vcC" in capsys.readouterr().err
    # vcZ alone, absent from the layout: run on the smallest VC by default, never a silent run of no jobs
    assert jobs("--clusters", "vcZ")["summary"]["gmux"]["jobs"] == 1
    assert main(["--traces", str(tmp_path), "--policy", "gmux", "--clusters", "vcZ", "--unknown-vc", "skip"]) == 2
    assert "no job is left to simulate (VC vcZ not in" in capsys.readouterr().err
    assert main(["--traces", str(tmp_path), "--policy", "gmux", "--gpus-per-machine", "65"]) == 2
    assert "gpus_per_machine must be in 1..64, not 65" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:       # refused before the trace is read
        main(["--traces", str(tmp_path), "--policy", "gmux", "--params", '{"gmux": {"nope": 1}}'])
    assert e.value.code == 2 and "nope" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:       # parameters for a policy not run would be silently unused
        main(["--traces", str(tmp_path), "--policy", "fifo", "--params", '{"gmux": {"min_run_s": 60}}'])
    assert e.value.code == 2 and "'gmux', not among the policies run (fifo)" in capsys.readouterr().err


needs_traces = pytest.mark.skipif(not os.path.isfile(os.path.join(TRACES, "philly.csv")),
                                  reason=f"real traces not found at {TRACES} (../shared/traces from the repo root)")


@needs_traces
def test_real_philly_files_load_and_validate():
    tr = load_trace(os.path.join(TRACES, "philly.csv"))
    assert len(tr.jobs) == 82247 and not tr.bad_rows
    vcs = load_vcs(os.path.join(TRACES, "philly_vc.csv"))
    assert len(vcs) == 11 and sum(vcs.values()) == 352
    tput = Throughputs(os.path.join(TRACES, "gavel_throughputs.json"))
    assert len(tput.by_scale[1]) == 26 and 60 <= len(tput.suspect_pairs) <= 200
    assign_types(tr, tput, seed=0)
    assert all(j.job_type in tput.solo for j in tr.jobs)


@needs_traces
def test_real_philly_slice_runs_under_every_policy(capsys):
    # Three days of the real trace (a few thousand jobs) under every policy, end to end through the CLI.
    assert main(["--policy", "fifo,sjf,srtf,tiresias,gandiva,gmux", "--start", "40d", "--end", "43d",
                 "--quiet"]) == 0


def test_cli_refuses_to_write_its_results_over_an_input_and_states_a_window_as_given(tmp_path, capsys):
    _files(tmp_path)
    before = (tmp_path / "philly.csv").read_text()
    for target in ("philly.csv", "philly_vc.csv", "gavel_throughputs.json"):
        with pytest.raises(SystemExit) as e:
            main(["--traces", str(tmp_path), "--policy", "fifo", "--json", str(tmp_path / target)])
        assert e.value.code == 2 and "would overwrite it" in capsys.readouterr().err
    assert (tmp_path / "philly.csv").read_text() == before
    # A pipe (or a device) is left as it is, not replaced by a file its reader never sees; a link keeps pointing
    # at the results.
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(SystemExit) as e:
        main(["--traces", str(tmp_path), "--policy", "fifo", "--json", str(tmp_path / "fifo")])
    assert e.value.code == 2 and "not a regular file (a device, pipe or socket)" in capsys.readouterr().err
    assert stat.S_ISFIFO(os.lstat(tmp_path / "fifo").st_mode)
    (tmp_path / "results.json").write_text("old")
    os.symlink("results.json", tmp_path / "link.json")
    assert main(["--traces", str(tmp_path), "--policy", "fifo", "--quiet", "--json", str(tmp_path / "link.json")]) == 0
    assert os.readlink(tmp_path / "link.json") == "results.json"
    assert json.loads((tmp_path / "results.json").read_text())["summary"]["fifo"]["jobs"] >= 1
    (tmp_path / "afile").write_text("")
    with pytest.raises(SystemExit):
        main(["--traces", str(tmp_path), "--policy", "fifo", "--json", str(tmp_path / "afile" / "x.json")])
    assert "is a file, not a directory" in capsys.readouterr().err
    assert main(["--traces", str(tmp_path), "--policy", "fifo", "--start", "2017-10-09", "--end", "2017-10-08"]) == 2
    assert "its end (2017-10-08 00:00:00) is not after its start (2017-10-09 00:00:00)" in capsys.readouterr().err
    # ISO 8601 as trace files write it, a zone taken to UTC
    assert main(["--traces", str(tmp_path), "--policy", "fifo", "--start", "2017-10-01T02:00:30+02:00",
                 "--quiet", "--json", str(tmp_path / "r.json")]) == 0
    assert json.loads((tmp_path / "r.json").read_text())["clusters"]["vcA"]["jobs"] == 1


def test_under_quiet_the_rows_left_out_are_still_said(tmp_path, capsys):
    _files(tmp_path, GOOD + BAD)
    assert main(["--traces", str(tmp_path), "--policy", "fifo", "--bad-rows", "skip", "--quiet"]) == 0
    out, err = capsys.readouterr()
    assert out == "" and "note: skipped 5 bad row(s): line 4:" in err


def test_a_header_naming_a_used_column_twice_and_a_file_not_in_utf8_are_refused_by_line(tmp_path):
    (tmp_path / "t.csv").write_text("timestamp,duration,num_gpus,timestamp,cluster\n5,10,1,6,a\n")
    with pytest.raises(TraceError, match="column\\(s\\) 'timestamp' more than once"):
        load_trace(str(tmp_path / "t.csv"))
    (tmp_path / "t.csv").write_bytes(b"timestamp,duration,num_gpus,cluster\n" + b"5,10,1,a\n" * 3000 +
                                     b"6,10,1,caf\xe9\n")
    with pytest.raises(TraceError, match="not a text file in UTF-8 at line 3002 \\(byte 0xe9"):
        load_trace(str(tmp_path / "t.csv"))


def test_gmux_sim_ends_quietly_when_interrupted_or_its_reader_goes(tmp_path):
    """Ctrl-C printed a traceback per worker; `gmux-sim | head -1` ended with BrokenPipeError's."""
    import signal
    import subprocess
    import sys
    import time
    _files(tmp_path, "".join(f"2017-10-01 00:{m:02d}:00,{3600 * (1 + m % 7)},1,{3600 * (1 + m % 7)},vcA\n"
                             for m in range(60)))
    command = [sys.executable, "-m", "gmux.cli.sim", "--traces", str(tmp_path), "--policy", "fifo,gmux"]
    piped = subprocess.run(f"{' '.join(command)} | head -1", shell=True, capture_output=True, text=True,
                           timeout=120)
    assert piped.stdout.count("\n") == 1 and "Traceback" not in piped.stderr and "Error" not in piped.stderr
    # a run long enough to be interrupted: a large trace, two workers
    _files(tmp_path, "".join(f"2017-10-01 00:00:{s % 60:02d},{600 + s},1,{600 + s},vcA\n" for s in range(30000)))
    run = subprocess.Popen(command + ["--workers", "2", "--policy", "gmux,tiresias"], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, start_new_session=True)
    time.sleep(3)
    assert run.poll() is None, run.communicate()
    os.killpg(run.pid, signal.SIGINT)          # as a terminal's Ctrl-C reaches the whole group
    out, err = run.communicate(timeout=60)
    assert run.returncode == 130 and err.strip() == "gmux-sim: interrupted (nothing written)", err


def test_vcs_of_the_layout_that_run_no_job_are_named_as_left_out_of_utilisation(tmp_path, capsys):
    # vcB's one job needs more GPUs than vcB has; vcC has none: their 88 GPUs are not vcA's 8
    rows = "2017-10-01 00:00:00,10,1,10,vcA\n2017-10-01 00:01:00,10,99,990,vcB\n"
    _files(tmp_path, rows, vcs="vc,node num\nvcA,1\nvcB,1\nvcC,10\n")
    assert main(["--traces", str(tmp_path), "--policy", "fifo", "--bad-rows", "skip", "--json",
                 str(tmp_path / "r.json")]) == 0
    assert "no job runs in VC(s) vcB, vcC: their 88 GPUs are left out of utilisation" in capsys.readouterr().out
    assert json.load(open(tmp_path / "r.json"))["summary"]["fifo"]["gpus"] == 8


def test_the_table_never_cuts_a_figure():
    big = {"jobs": 3, "avg_jct_s": 3.6e9, "p50_jct_s": 3.6e9, "p99_jct_s": 3.6e10, "avg_queue_s": 3.6e9,
           "avg_slowed_s": 3.6e9, "p99_first_progress_s": 3.6e10, "makespan_s": 8.64e11, "utilisation": 0.5,
           "work_utilisation": 1.25, "suspends": 25_887_741_000, "packs": 123_456_789, "unpacks": 98_765_432,
           "migrations": 1_234_567}
    text = render_table({"gandiva": big, "fifo": dict(big, suspends=0)}, {"gandiva": {"p99": 12345.67}})
    for figure in ("1000000.00", "10000000.00", "10000000.0", "125.0", "25,887,741,000", "123,456,789",
                   "98,765,432", "1,234,567", "12345.67"):
        assert figure in text
    assert "…" not in text and all(line.endswith(("┓", "┃", "┩", "│", "┘")) for line in text.split("\n")[:-1])


def test_utilisation_is_plotted_over_whole_windows_of_the_series_and_says_how_long():
    hours = np.arange(50.0)                      # hourly buckets: 24 h windows, the last one 2 h
    util = np.arange(50.0) / 100
    start, mean, window = windows(hours, util, 24)
    assert window == 24 and list(start) == [0, 24, 48]
    assert np.allclose(mean, [util[:24].mean(), util[24:48].mean(), util[48:].mean()])
    start, mean, window = windows(np.arange(10) * 48.0, util[:10], 24)     # a long trace's 48 h buckets
    assert window == 48 and len(mean) == 10 and np.allclose(mean, util[:10])
