"""How gmux-sim ends when something goes wrong around the simulation: its results files are written whatever
becomes of standard output, never half-written, a run refused or failed leaves no directory it made for them, and
a worker process killed mid-run ends the run instead of leaving it waiting for ever."""
import errno
import io
import json
import os
import signal
import sys

import pytest

from sim_harness import write_table
from gmux.cli.sim import main
from gmux.cluster.sim import run
from gmux.cluster.sim.run import _run_one

ROWS = "timestamp,duration,num_gpus,gpu_time,cluster\n2017-10-01 00:00:00,10,1,10,vcA\n"


def _files(tmp_path, rows=ROWS):
    (tmp_path / "philly.csv").write_text(rows)
    (tmp_path / "philly_vc.csv").write_text("vc,node num\nvcA,1\n")
    write_table(tmp_path / "gavel_throughputs.json", {("A", "B"): [0.8, 0.7]})
    return ["--traces", str(tmp_path), "--policy", "fifo"]


class _FailingOutput(io.TextIOBase):
    """Standard output whose every write fails as `error` (a reader gone, a full disk); its file descriptor is a
    file of the test's, which the command points at /dev/null."""

    def __init__(self, error: OSError, fd: int):
        self.error, self.fd = error, fd

    def write(self, text):
        raise self.error

    def fileno(self):
        return self.fd


@pytest.mark.parametrize("error,said", [(BrokenPipeError(errno.EPIPE, "Broken pipe"), ""),
                                        (OSError(errno.ENOSPC, "No space left on device"),
                                         "gmux-sim: error: cannot write to standard output (No space left on "
                                         "device)\n")])
def test_the_results_file_is_written_when_standard_output_fails(tmp_path, monkeypatch, capsys, error, said):
    """`gmux-sim --json r.json | head -1` ended at the broken pipe before writing r.json; a table sent to a full
    disk ended in a traceback, with r.json not written either."""
    args = _files(tmp_path)
    with open(tmp_path / "stdout", "w") as f:
        monkeypatch.setattr(sys, "stdout", _FailingOutput(error, f.fileno()))
        assert main(args + ["--json", str(tmp_path / "out" / "r.json")]) == 1
    assert json.loads((tmp_path / "out" / "r.json").read_text())["summary"]["fifo"]["jobs"] == 1
    assert capsys.readouterr().err == said


def test_a_results_file_that_cannot_be_written_is_said_and_no_plot_is_left_half_written(tmp_path, monkeypatch,
                                                                                        capsys):
    import matplotlib.figure

    def disk_full(fig, target, **kwargs):
        target.write(b"\x89PNG half")
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", disk_full)
    args = _files(tmp_path)
    assert main(args + ["--json", str(tmp_path / "r.json"), "--plots", str(tmp_path / "plots")]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.strip().endswith(
        f"cannot write {tmp_path / 'plots' / 'jct_cdf.png'} (No space left on device) (the table above has the "
        f"results)")
    assert json.loads((tmp_path / "r.json").read_text())["summary"]["fifo"]["jobs"] == 1
    assert not os.path.exists(tmp_path / "plots")      # (made for the plots, and nothing was written there)

    def refused(path, payload):
        raise OSError(errno.EROFS, "Read-only file system")
    monkeypatch.setattr("gmux.cluster.sim.metrics.write_json", refused)
    assert main(args + ["--quiet", "--json", str(tmp_path / "r2.json")]) == 1
    assert capsys.readouterr().err.strip().endswith(f"cannot write {tmp_path / 'r2.json'} (Read-only file system)")


def test_an_interrupt_while_the_results_are_written_says_which_were(tmp_path, monkeypatch, capsys):
    """It said "nothing written" with the JSON file already written."""
    def interrupted(results, path):
        raise KeyboardInterrupt
    monkeypatch.setattr("gmux.cluster.sim.plots.plot_jct_cdf", interrupted)
    args = _files(tmp_path)
    assert main(args + ["--quiet", "--json", str(tmp_path / "r.json"), "--plots", str(tmp_path / "p")]) == 130
    assert capsys.readouterr().err.endswith(f"gmux-sim: interrupted ({tmp_path / 'r.json'} written)\n")
    assert (tmp_path / "r.json").exists() and not (tmp_path / "p").exists()


def test_a_refused_run_leaves_no_directory_it_made_for_its_results(tmp_path, capsys):
    args = _files(tmp_path, ROWS + "2017-10-01 00:00:00,nan,1,nan,vcA\n")
    assert main(args + ["--json", str(tmp_path / "a" / "b" / "r.json"), "--plots", str(tmp_path / "p" / "q")]) == 2
    assert "duration 'nan' is not a number >= 0" in capsys.readouterr().err
    assert sorted(os.listdir(tmp_path)) == ["gavel_throughputs.json", "philly.csv", "philly_vc.csv"]
    (tmp_path / "kept").mkdir()         # a directory that was there before is left, even empty
    with pytest.raises(SystemExit):
        main(args + ["--json", str(tmp_path / "kept" / "new" / "r.json"), "--copy-gbps", "0"])
    assert os.listdir(tmp_path / "kept") == []
    with pytest.raises(SystemExit):
        main(args + ["--json", str(tmp_path / "kept" / "r"), "--plots", str(tmp_path / "kept" / "." / "r")])
    assert "--json and --plots name one path" in capsys.readouterr().err and os.listdir(tmp_path / "kept") == []


def _killed_on_gmux(task):
    """A worker's task (found by name in the forked worker) that kills its worker when it is gmux's."""
    if task[0] == "gmux":
        os.kill(os.getpid(), signal.SIGKILL)
    return _run_one(task)


def test_a_worker_killed_mid_run_ends_the_run_with_a_message(tmp_path, monkeypatch, capsys):
    """The pool started another worker in a killed one's place and never did its task: gmux-sim waited for ever."""
    monkeypatch.setattr(run, "_run_one", _killed_on_gmux)
    monkeypatch.setattr(run, "WORKER_POLL_S", 0.05)
    args = _files(tmp_path)
    assert main(args + ["--policy", "fifo,gmux", "--workers", "2", "--json", str(tmp_path / "out" / "r.json")]) == 1
    assert "ended mid-run (killed by signal 9; out of memory?)" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_json_dash_writes_the_results_to_standard_output_alone(tmp_path, monkeypatch, capsys):
    """`gmux-sim --json -` wrote a file named - and the table to standard output, where `| jq` wanted JSON."""
    args = _files(tmp_path)
    monkeypatch.chdir(tmp_path)
    assert main(args + ["--json", "-"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["summary"]["fifo"]["jobs"] == 1      # (nothing else on standard output)
    assert "fifo" in err and "simulated in" in err
    assert not os.path.exists(tmp_path / "-")
    assert main(args + ["--json", "./-", "--quiet"]) == 0       # (a file named - is still one away)
    assert capsys.readouterr().out == "" and json.loads((tmp_path / "-").read_text())["summary"]["fifo"]["jobs"] == 1


def test_json_dash_with_its_reader_gone_still_writes_the_plots(tmp_path, monkeypatch, capsys):
    """`gmux-sim --json - --plots p | head -1`: the reader has what it wanted; the plots are still written."""
    args = _files(tmp_path)
    monkeypatch.chdir(tmp_path)
    with open(tmp_path / "stdout", "w") as f:
        monkeypatch.setattr(sys, "stdout", _FailingOutput(BrokenPipeError(errno.EPIPE, "Broken pipe"), f.fileno()))
        assert main(args + ["--json", "-", "--plots", str(tmp_path / "p")]) == 1
    assert sorted(os.listdir(tmp_path / "p")) == ["jct_cdf.png", "utilisation.png"]
    assert "Traceback" not in capsys.readouterr().err


def test_plots_dash_is_refused_with_no_directory_made(tmp_path, monkeypatch, capsys):
    args = _files(tmp_path)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        main(args + ["--plots", "-"])
    assert e.value.code == 2 and "--plots -: the plots are two PNG files" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "-")
