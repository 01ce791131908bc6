"""Trace files are untrusted input: whatever a file holds, reading it gives jobs that make sense or a TraceError
that names the file, never another exception (a traceback) and never a job the simulator cannot run."""
import math
import string

from hypothesis import HealthCheck, given, settings, strategies as st

from sim_harness import write_table
from gmux.cli.sim import main
from gmux.cluster.sim.trace import MAX_DURATION, MAX_JOB_GPUS, TraceError, load_trace, load_vcs

LAYOUTS = [("timestamp", "duration", "num_gpus", "gpu_time", "cluster"),
           ("submit_time", "start_time", "end_time", "gpu_num", "vc", "user"),
           ("submit_time", "duration", "gpu_num", "state"),
           ("start_time", "end_time", "plan_gpu", "inst_num", "gpu_milli")]
HOSTILE = st.one_of(
    st.sampled_from(["", "0", "-1", "1.5", "1e309", "-1e309", "nan", "inf", "1e-320", "9" * 40, "\x00", "\"",
                     "2017-10-01 00:00:00+05:00", "0001-01-01 00:00:00", "9999-12-31 23:59:59",
                     "2017-02-30 00:00:00", "\u0663", "1_0", " 7 ", "\x1b[31m", "a,b"]),
    st.text(string.printable, max_size=12), st.text(max_size=6),
    st.integers(-10**20, 10**20).map(str), st.floats(allow_nan=True, allow_infinity=True).map(repr))
DATE = st.integers(0, 10**7).map(lambda s: f"2017-10-{1 + s // 86400 % 28:02d} {s // 3600 % 24:02d}:"
                                          f"{s // 60 % 60:02d}:{s % 60:02d}")
GOOD = {"timestamp": DATE, "submit_time": st.integers(0, 10**6).map(str), "start_time": DATE, "end_time": DATE,
        "duration": st.integers(1, 10**6).map(str), "num_gpus": st.sampled_from(["1", "2", "4", "8", "16"]),
        "gpu_num": st.sampled_from(["0", "1", "8"]), "plan_gpu": st.sampled_from(["25", "50", "100", "800"]),
        "inst_num": st.sampled_from(["1", "2"]), "gpu_milli": st.sampled_from(["500", "1000"]),
        "gpu_time": st.integers(1, 10**6).map(str), "cluster": st.sampled_from(["vcA", "vcB"]),
        "vc": st.sampled_from(["vcA", "vcB"]), "user": st.sampled_from(["u1", "u2", ""]),
        "state": st.sampled_from(["COMPLETED", "FAILED"])}


@st.composite
def trace_files(draw):
    header = list(draw(st.sampled_from(LAYOUTS)))
    if draw(st.booleans()):
        header = draw(st.permutations(header))
    rows = []
    for _ in range(draw(st.integers(0, 8))):
        row = [draw(HOSTILE if draw(st.integers(0, 9)) == 0 else GOOD[name]) for name in header]
        rows.append(row if draw(st.integers(0, 9)) else row[: draw(st.integers(0, len(row)))])
    text = "\n".join(",".join(r) for r in [header, *rows]) + draw(st.sampled_from(["", "\n", "\r\n", "\x00"]))
    return text.encode("utf-8", "surrogatepass") + draw(st.sampled_from([b"", b"", b"\xff\xfe,1\n"]))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(trace_files(), st.sampled_from(["refuse", "skip"]))
def test_any_trace_file_gives_runnable_jobs_or_a_trace_error(tmp_path, data, bad_rows):
    path = tmp_path / "t.csv"
    path.write_bytes(data)
    try:
        tr = load_trace(str(path), bad_rows=bad_rows)
    except TraceError as e:
        assert str(path) in str(e)
        return
    assert tr.jobs
    for j in tr.jobs:
        assert math.isfinite(j.submit) and j.submit >= 0, j
        assert 0 < j.duration <= MAX_DURATION and 1 <= j.num_gpus <= MAX_JOB_GPUS, j
        assert isinstance(j.vc, str) and j.vc, j


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.lists(HOSTILE | st.sampled_from(["vcA", "1", "8"]), max_size=3), max_size=5), st.sampled_from(["vc,node num", "vc", "x,y", ""]))
def test_any_vc_layout_file_gives_machine_counts_or_a_trace_error(tmp_path, rows, header):
    path = tmp_path / "vcs.csv"
    path.write_text("\n".join([header, *(",".join(r) for r in rows)]), encoding="utf-8", errors="surrogatepass")
    try:
        vcs = load_vcs(str(path))
    except TraceError as e:
        assert str(path) in str(e)
        return
    assert vcs and all(isinstance(n, int) and n >= 1 for n in vcs.values())


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(trace_files(), st.booleans())
def test_gmux_sim_replays_any_trace_file_or_says_why_not(tmp_path, capsys, data, one_cluster):
    """Through the CLI, with every policy: exit 0 with a table, or 2 with one error line; never a traceback."""
    (tmp_path / "t.csv").write_bytes(data)
    (tmp_path / "vcs.csv").write_text("vc,node num\nvcA,1\nvcB,2\n")
    write_table(tmp_path / "tp.json", {("A", "B"): [0.8, 0.7]})
    layout = ["--machines", "1"] if one_cluster else ["--vcs", str(tmp_path / "vcs.csv")]
    rc = main(["--trace", str(tmp_path / "t.csv"), *layout, "--throughputs", str(tmp_path / "tp.json"),
               "--bad-rows", "skip", "--policy", "fifo,srtf,tiresias,gandiva,gmux", "--quiet"])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    assert (rc, err.startswith("gmux-sim: error: ")) in ((0, False), (2, True)), (rc, err)
