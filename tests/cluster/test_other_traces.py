"""Traces of other clusters than Philly: Helios' and Acme's column names, times in seconds, durations from start
and end, columns named on the command line; rows of no GPU job left out and counted; a trace that does not match
the layout refused with what to do instead."""
import json

import pytest

from sim_harness import write_table
from gmux.cli.sim import main
from gmux.cluster.sim.trace import TraceError, load_trace, load_vcs

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
    assert [(j.line, j.submit, j.duration, j.num_gpus, j.vc, j.user) for j in tr.jobs] == \
        [(4, 0.0, 3600.0, 2, "vcX", "u2"), (5, 60.0, 30.0, 1, "vcY", "u3")]
    assert tr.skipped == {"no GPU": 1, "never ran": 1} and tr.bad_rows == []
    assert str(tr.origin) == "2020-04-01 00:01:00"
    assert "2 user(s) in user: a job's sweep is among its own user's jobs" in tr.notes


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
    assert "line 3: end_time '1600000030' is before start_time '1600000060'" in str(e.value)
    assert "line 4: submit_time '2020-09-13 12:30:00' is a date, the trace's first row (line 2) seconds" in str(e.value)
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
    with pytest.raises(TraceError, match="column 'secs' cannot be both duration and gpus"):
        load_trace(str(tmp_path / "t.csv"), columns={"submit": "queued_at", "duration": "secs", "gpus": "secs"})


def test_a_gpu_count_beyond_any_cluster_is_a_bad_row(tmp_path):
    trace = _load(tmp_path, "submit_time,duration,num_gpus\n0,10,1e308\n1,10,6400001\n2,10,6400000\n",
                  bad_rows="skip")
    assert [ln for ln, _ in trace.bad_rows] == [2, 3] and [j.num_gpus for j in trace.jobs] == [6_400_000]
    assert "makes 6,400,001 GPUs, more than the largest cluster gmux-sim builds (6,400,000)" in trace.bad_rows[1][1]


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


def _load(tmp_path, text, **kw):
    (tmp_path / "t.csv").write_text(text)
    return load_trace(str(tmp_path / "t.csv"), **kw)


def test_parts_of_a_gpu_get_whole_gpus_and_the_notes_say_how_many(tmp_path):
    """openb's gpu_milli (250: a quarter of each GPU) was ignored without a word, and PAI's plan_gpu (a percent:
    800 is eight GPUs) named as the GPU column gave 800 GPUs."""
    tr = _load(tmp_path, "name,num_gpu,gpu_milli,creation_time,scheduled_time,deletion_time\n"
                         "a,1,250,10,12,112\nb,2,1000,20,20,80\nc,0,0,30,31,40\nd,1,500,40,41,\n",
               columns={"submit": "creation_time", "start": "scheduled_time", "end": "deletion_time"})
    assert [(j.num_gpus, j.duration) for j in tr.jobs] == [(1, 100.0), (2, 60.0)]
    assert tr.notes == ["1 job(s) ask for part of a GPU (gpu_milli < 1000); each runs on whole GPUs here (the "
                        "simulator places whole GPUs)"]
    assert tr.skipped == {"no GPU": 1, "unfinished": 1}
    # openb's own column names are known: the same list loads without naming them
    tr = _load(tmp_path, "name,num_gpu,gpu_milli,creation_time,scheduled_time,deletion_time\n"
                         "a,1,250,10,12,112\nb,2,1000,20,20,80\nc,0,0,30,31,40\nd,1,500,40,41,\n")
    assert [(j.submit, j.num_gpus, j.duration) for j in tr.jobs] == [(0.0, 1, 100.0), (10.0, 2, 60.0)]
    with pytest.raises(TraceError, match="line 2: gpu_milli 'x' is not a number in"):
        _load(tmp_path, "submit_time,duration,num_gpu,gpu_milli\n0,10,1,x\n")
    # a gpu_time column counts the GPU time asked for, not the whole GPUs it is rounded up to
    tr = _load(tmp_path, "timestamp,duration,plan_gpu,inst_num,gpu_time\n0,10,50,3,15\n")
    assert [j.num_gpus for j in tr.jobs] == [3]
    pai = "job_name,start_time,end_time,plan_gpu\na,0,10,50.0\nb,5,15,800.0\nc,6,16,\n"
    tr = _load(tmp_path, pai, columns={"submit": "start_time", "gpus": "plan_gpu"})
    assert [j.num_gpus for j in tr.jobs] == [1, 8] and tr.skipped == {"no GPU": 1}
    assert tr.notes[0] == ("GPU column plan_gpu read as percent of a GPU (--gpu-unit); 1 job(s) asking for part "
                           "of a GPU rounded up to whole GPUs")
    tr = _load(tmp_path, pai.replace("plan_gpu", "gpu_req"), columns={"submit": "start_time", "gpus": "gpu_req"},
               gpu_unit="milli")
    assert [j.num_gpus for j in tr.jobs] == [1, 1] and "thousandths" in tr.notes[0]
    tr = _load(tmp_path, pai, columns={"submit": "start_time", "gpus": "plan_gpu"}, gpu_unit="gpus")
    assert [j.num_gpus for j in tr.jobs] == [50, 800]       # the caller's word overrides the name
    assert not any("percent" in n for n in tr.notes)


# Alibaba PAI 2020's pai_task_table, with its header line put first: a task's GPUs are inst_num instances of
# plan_gpu (percent) each, and its launch (start_time) is all it says of its arrival.
PAI = ("job_name,task_name,inst_num,status,start_time,end_time,plan_cpu,plan_mem,plan_gpu,gpu_type\n"
       "j1,worker,8.0,Terminated,1739162.0,1739200.0,600.0,29.3,100.0,V100\n"
       "j2,ps,2.0,Terminated,1739170.0,1739300.0,600.0,29.3,,MISC\n"
       "j3,worker,4.0,Failed,1739180.0,1740180.0,400.0,10.0,50.0,T4\n"
       "j4,tensorflow,1.0,Running,1739190.0,,600.0,29.3,100.0,P100\n"
       "j5,worker,0.0,Terminated,1739195.0,1739200.0,600.0,29.3,100.0,P100\n"
       "j6,worker,1.0,Waiting,,,600.0,29.3,100.0,T4\n")


def test_an_alibaba_pai_task_table_counts_every_instance_and_arrives_at_launch(tmp_path):
    """inst_num was ignored: a task of 8 instances of one GPU each ran as a 1-GPU job; without a column of
    submission times the table was refused."""
    tr = _load(tmp_path, PAI)
    assert [(j.submit, j.duration, j.num_gpus) for j in tr.jobs] == [(0.0, 38.0, 8), (18.0, 1000.0, 4)]
    assert tr.skipped == {"no GPU": 2, "unfinished": 1, "never ran": 1} and not tr.bad_rows
    assert tr.notes == ["GPU column plan_gpu read as percent of a GPU (--gpu-unit); 1 job(s) asking for part of a "
                        "GPU rounded up to whole GPUs",
                        "each job's GPUs are its plan_gpu per instance times its inst_num instances",
                        "no submission time column: each job arrives at its start_time (the wait it had in the "
                        "traced cluster is not replayed)"]
    with pytest.raises(TraceError, match="line 2: inst_num '2.5' is not a whole number of instances"):
        _load(tmp_path, PAI.replace("8.0,Terminated", "2.5,Terminated"))
    # errors name the file's own columns, not the loader's words for them
    with pytest.raises(TraceError, match="line 2: end_time '1.0' is before start_time '1739162.0'"):
        _load(tmp_path, PAI.replace("1739200.0,600", "1.0,600", 1))


def test_a_trace_without_its_header_line_says_so(tmp_path):
    with pytest.raises(TraceError, match="first line looks like data: .*needs one put first"):
        _load(tmp_path, PAI.split("\n", 1)[1])
    with pytest.raises(TraceError) as e:
        _load(tmp_path, "queued_at,secs,n_gpu\n0,50,2\n")
    assert "looks like data" not in str(e.value)


def test_gmux_sim_reads_a_gpu_column_in_percent_when_told(tmp_path, capsys):
    tput = _tables(tmp_path)
    (tmp_path / "t.csv").write_text("submit_time,duration,gpu_num\n0,10,50\n5,10,300\n")
    assert main(["--trace", str(tmp_path / "t.csv"), "--machines", "1", *tput, "--policy", "fifo",
                 "--gpu-unit", "percent", "--json", str(tmp_path / "r.json")]) == 0
    assert "GPU column gpu_num read as percent of a GPU (--gpu-unit); 1 job(s)" in capsys.readouterr().out
    assert json.loads((tmp_path / "r.json").read_text())["summary"]["fifo"]["jobs"] == 2
    with pytest.raises(SystemExit):
        main(["--trace", str(tmp_path / "t.csv"), "--machines", "1", *tput, "--gpu-unit", "halves"])


def test_rows_of_no_finished_gpu_job_are_counted_and_malformed_ones_stay_bad(tmp_path):
    """An empty GPU field (a CPU task) and a job started but not ended were bad rows needing --bad-rows skip; an
    empty duration is end - start, and an end before its start is bad even beside a duration."""
    head = "submit_time,start_time,end_time,duration,gpu_num\n"
    tr = _load(tmp_path, head + "2020-01-01 00:00:00,2020-01-01 00:00:00,2020-01-01 00:01:40,,2\n"
                                "2020-01-01 00:00:10,2020-01-01 00:00:10,2020-01-01 00:00:20,10,\n"
                                "2020-01-01 00:00:20,2020-01-01 00:00:30,,,1\n"
                                "2020-01-01 00:00:25,2020-01-01 00:00:30,,5,1\n"
                                "2020-01-01 00:00:30,,2020-01-01 00:00:40,,1\n")
    assert [(j.duration, j.num_gpus) for j in tr.jobs] == [(100.0, 2)]
    assert tr.skipped == {"no GPU": 1, "unfinished": 2, "never ran": 1} and not tr.bad_rows
    with pytest.raises(TraceError) as e:
        _load(tmp_path, head + "2020-01-01 00:00:00,2020-01-01 00:00:10,2019-01-01 00:00:00,30,1\n"
                               "2020-01-01 00:00:00,2020-01-01 00:00:10,2020-01-01 00:00:20,10,NaN\n")
    assert "line 2: end_time '2019-01-01 00:00:00' is before start_time" in str(e.value)
    assert "line 3: gpu_num 'NaN' is not a whole number" in str(e.value)
    with pytest.raises(TraceError, match="line 2: empty duration"):
        _load(tmp_path, "submit_time,duration,gpu_num\n0,,1\n")


def test_a_duration_that_disagrees_with_start_and_end_is_stated(tmp_path):
    tr = _load(tmp_path, "submit_time,start_time,end_time,duration,gpu_num\n"
                         "0,0,100,100.4,1\n0,0,1000,1009,1\n0,0,100,150,1\n0,0,100,30,2\n")
    assert [j.duration for j in tr.jobs] == [100.4, 1009.0, 150.0, 30.0]
    assert tr.notes == ["2 job(s) have a duration that differs from end_time - start_time by more than a second "
                        "or 1%; their duration is used"]


def test_byte_order_marks_header_case_and_integral_node_counts(tmp_path):
    (tmp_path / "t.csv").write_text("\ufeffSubmit_Time,Duration,GPU_Num,VC\n2020-01-01 00:00:00,60,1,vcA\n",
                                    encoding="utf-8")
    assert [(j.duration, j.vc) for j in load_trace(str(tmp_path / "t.csv")).jobs] == [(60.0, "vcA")]
    (tmp_path / "v.csv").write_text("\ufeffVC,node num\nvcA,2.0\n", encoding="utf-8")
    assert load_vcs(str(tmp_path / "v.csv")) == {"vcA": 2}
    for row, needle in (("vcA,2.5", "node count '2.5' is not a positive integer"),
                        ("vcA,100000000000", "node count .*more than 100,000 machines"),
                        ("vcA", "node count missing"), (" ,3", "no VC name")):
        (tmp_path / "v.csv").write_text(f"vc,node num\n{row}\n")
        with pytest.raises(TraceError, match=f"line 2: {needle}"):
            load_vcs(str(tmp_path / "v.csv"))


def test_times_without_a_zone_are_stated_and_a_mix_refused(tmp_path):
    head = "timestamp,duration,num_gpus\n"
    assert _load(tmp_path, head + "2020-01-01 00:00:00,10,1\n").notes == \
        ["the trace's times are dates without a zone, taken as UTC"]
    assert _load(tmp_path, head + "2020-01-01T00:00:00+08:00,10,1\n").notes == []
    with pytest.raises(TraceError) as e:
        _load(tmp_path, head + "2020-01-01 00:00:00,10,1\n2020-01-01T00:00:00+08:00,10,1\n"
                               "1600000000000,10,1\n2020-01-01 00:00:00,1e12,1\n")
    msg = str(e.value)
    assert ("line 3: timestamp '2020-01-01T00:00:00+08:00' has a zone offset, the trace's first date (line 2) has "
            "none") in msg
    assert "line 5: duration 1e+12 s is more than 100 years" in msg
    with pytest.raises(TraceError, match="line 2: .*1600000000000.*milliseconds or microseconds since the epoch"):
        _load(tmp_path, head + "1600000000000,10,1\n")
    # A rejected first row fixes neither the kind of time nor the zone: the rows after it are read as they are.
    trace = _load(tmp_path, head + "0001-01-01T00:00:00+08:00,10,1\n1600000000000,10,1\n2020-01-01 00:00:00,10,1\n",
                  bad_rows="skip")
    assert [ln for ln, _ in trace.bad_rows] == [2, 3] and len(trace.jobs) == 1
    assert "the trace's times are dates without a zone, taken as UTC" in trace.notes
    # ... nor one whose times are well formed and a later field is not
    trace = _load(tmp_path, head + "2017-10-01 00:00:00,10,x\n100,10,1\n200,10,2\n", bad_rows="skip")
    assert [ln for ln, _ in trace.bad_rows] == [2] and [j.num_gpus for j in trace.jobs] == [1, 2]
    assert trace.jobs[1].submit == 100.0


def test_line_numbers_are_the_files_lines_and_an_all_bad_trace_says_so(tmp_path):
    head = "\n\ntimestamp,duration,num_gpus,note\n"      # blank lines before the header are not the header
    text = head + '0,10,1,"two\nlines"\n5,10,1,x\n9,ten,1,x\n'
    with pytest.raises(TraceError, match=r"1 bad row\(s\): line 7: duration 'ten'"):
        _load(tmp_path, text)
    with pytest.raises(TraceError, match=r"malformed CSV by line 7 \(unexpected end of data\)"):
        _load(tmp_path, text.replace("9,ten", '9,"ten'), bad_rows="skip")   # a quote left open swallowed the rest
    with pytest.raises(TraceError, match=r"no usable job rows \(1 no GPU, 2 bad \(skipped\)\)"):
        _load(tmp_path, head + "0,ten,1,x\n1,10,0,x\n2,10,-1,x\n", bad_rows="skip")


def test_a_job_wider_than_its_vc_names_the_way_out_and_is_not_counted_as_run(tmp_path, capsys):
    tput = _tables(tmp_path)
    (tmp_path / "t.csv").write_text("submit_time,duration,gpu_num,vc\n0,10,1,vcX\n1,10,1,vcNEW\n2,10,64,vcNEW\n")
    args = ["--trace", str(tmp_path / "t.csv"), "--vcs", str(tmp_path / "vcs.csv"), *tput, "--policy", "fifo"]
    assert main(args) == 2
    assert "line 4: needs 64 GPUs, VC vcNEW has 8. Skip them with --bad-rows skip" in capsys.readouterr().err
    assert main(args + ["--bad-rows", "skip"]) == 0
    out = capsys.readouterr().out
    assert "1 job(s) of VC(s) absent from the layout (vcNEW) each run" in out
    assert "skipped 1 job(s) larger than their cluster: line 4: needs 64 GPUs, VC vcNEW has 8" in out


def test_times_in_milliseconds_or_microseconds_are_read_when_told_and_suspected_when_not(tmp_path):
    """Google's traces count microseconds: read as seconds, their jobs ran for years, with no word said."""
    us = "time,gpus,duration_us\n600000000,1,600000000\n660000000,1,1200000000\n720000000,2,300000000\n"
    cols = {"submit": "time", "duration": "duration_us"}
    tr = _load(tmp_path, us, columns=cols, time_unit="us")
    assert [(j.submit, j.duration, j.num_gpus) for j in tr.jobs] == [(0.0, 600.0, 1), (60.0, 1200.0, 1),
                                                                     (120.0, 300.0, 2)]
    assert "numeric times and durations read as microseconds (--time-unit)" in tr.notes
    as_seconds = _load(tmp_path, us, columns=cols)
    assert any("half the jobs run longer than" in n and "--time-unit" in n for n in as_seconds.notes)
    with pytest.raises(TraceError, match=r"more than 100 years \(are the trace's times not seconds\? --time-unit"):
        _load(tmp_path, us.replace("1200000000", "12000000000"), columns=cols)
    ms = "submit_time,num_gpus,duration\n1600000000000,1,3600000\n"
    with pytest.raises(TraceError, match="milliseconds or microseconds since the epoch\\? say so with --time-unit"):
        _load(tmp_path, ms)
    assert [(j.duration, str(_load(tmp_path, ms, time_unit="ms").origin))
            for j in _load(tmp_path, ms, time_unit="ms").jobs] == [(3600.0, "2020-09-13 12:26:40")]
    with pytest.raises(ValueError, match="time_unit must be one of s, ms, us"):
        _load(tmp_path, ms, time_unit="min")


def test_a_trace_spanning_millennia_runs_its_short_jobs(tmp_path, capsys):
    """Thousands of years from its origin the simulated clock rounds to ~1e-4 s: a 1.3 s job failed the run on an
    internal check ("completed with 0.000012 s of work left") naming neither file nor line."""
    tput = _tables(tmp_path)
    (tmp_path / "t.csv").write_text("submit_time,gpus,duration\n-62135000000,1,3600\n253402000000,1,1.3\n"
                                    "253402000000,1,1.3\n253402000001,1,0.003\n")
    assert main(["--trace", str(tmp_path / "t.csv"), "--machines", "1", *tput, "--policy", "fifo,srtf,gmux",
                 "--quiet", "--json", str(tmp_path / "r.json")]) == 0, capsys.readouterr().err
    assert json.loads((tmp_path / "r.json").read_text())["summary"]["fifo"]["jobs"] == 4


@pytest.mark.parametrize("header,meaning", [("timestamp,job_id,submit_time,gpus,duration", "submit"),
                                            ("submit_time,num_gpus,gpu_num,duration", "gpus"),
                                            ("submit_time,cluster,vc,gpus,duration", "vc")])
def test_two_columns_that_could_mean_the_same_are_refused_until_told_which(tmp_path, header, meaning):
    """The first name known won, silently: a Helios log with a cluster column was read by it."""
    row = ",".join({"timestamp": "2020-04-01 01:00:00", "submit_time": "2020-04-01 00:00:00", "job_id": "j1",
                    "gpus": "1", "num_gpus": "1", "gpu_num": "2", "duration": "3600", "cluster": "Venus",
                    "vc": "vcX"}[h] for h in header.split(","))
    with pytest.raises(TraceError, match=f"could each be the {meaning}: say which with --columns {meaning}=NAME"):
        _load(tmp_path, f"{header}\n{row}\n")
    chosen = {"submit": "submit_time", "gpus": "gpu_num", "vc": "vc"}[meaning]
    job, = _load(tmp_path, f"{header}\n{row}\n", columns={meaning: chosen}).jobs
    assert (str(_load(tmp_path, f"{header}\n{row}\n", columns={meaning: chosen}).origin), job.num_gpus,
            job.vc) == ("2020-04-01 00:00:00", 2 if meaning == "gpus" else 1, "vcX" if meaning == "vc" else "all")


def test_a_gpu_milli_column_alone_is_the_gpu_column_in_thousandths(tmp_path):
    job, = _load(tmp_path, "creation_time,deletion_time,scheduled_time,gpu_milli\n0,3600,60,500\n").jobs
    assert (job.submit, job.duration, job.num_gpus) == (0.0, 3540.0, 1)


def test_a_gpu_time_that_disagrees_says_what_it_should_be_in_the_traces_units(tmp_path):
    with pytest.raises(TraceError, match=r"gpu_time '360000' is not the job's duration x GPUs \(3600 in the "):
        _load(tmp_path, "timestamp,duration,num_gpus,gpu_time,cluster\n2017-10-01 00:00:00,3600,100,360000,a\n",
              gpu_unit="percent")
