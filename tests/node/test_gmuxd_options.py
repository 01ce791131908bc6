"""gmuxd's command line reaches the daemon it builds: what each tuning option sets (checked at the Daemon's door,
before anything starts)."""
import pytest

from gmux.cli import gmuxd
from gmux.node.pacing import Pacing


class Built(Exception):
    pass


def _options(monkeypatch, tmp_path, *args):
    def build(rundir, gpus, rebind=None, options=None):
        raise Built(options)
    monkeypatch.setattr(gmuxd, "Daemon", build)
    with pytest.raises(Built) as built:
        gmuxd.main(["--runtime-dir", str(tmp_path / "rt"), "--virtual-gpus", "1x1GiB", *args])
    return built.value.args[0]


def test_the_deadline_floor_sets_the_pacing_of_every_slicer(monkeypatch, tmp_path):
    assert _options(monkeypatch, tmp_path).pacing == Pacing()
    assert _options(monkeypatch, tmp_path, "--deadline-floor", "30").pacing == Pacing(floor=30.0)


@pytest.mark.parametrize("bad", ["0", "-1", "nan", "inf", "1e999", "soon"])
def test_a_deadline_floor_that_is_not_a_positive_number_is_refused_naming_it(capsys, bad):
    with pytest.raises(SystemExit) as e:
        gmuxd.main(["--deadline-floor", bad])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "--deadline-floor" in err and ("finite number > 0" in err or "not a number" in err), err
