"""gmux-sim and the simulator benchmarks given hostile inputs an outside tester found to end in a traceback or in a
file that is not what it says: each is refused with a usage error or handled, and says so."""
import pytest

from sim_harness import write_table
from gmux.cli.sim import main


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
