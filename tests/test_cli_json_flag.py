"""Whether a command line asks gmux for JSON is read before argparse parses it (so that a refused command line
is answered in JSON too), and a --json that belongs to the submitted command is not gmux's."""
import json

import pytest

from gmux.cli import gmux as gmux_cli


@pytest.mark.parametrize("argv", [
    ["submit", "--gpus", "x", "python", "train.py", "--json"],          # the script's own --json
    ["submit", "--gpus", "x", "--", "python", "train.py", "--json"],
    ["submit", "--name", "--json", "--gpus", "x", "python", "t.py"],     # --json as --name's value
    ["--runtime-dir", "/nowhere", "submit", "--mem", "x", "python", "t.py", "--json"],
    ["submit", "--cluster", "tcp://h:1", "--keys", "k", "--ranks", "x", "python", "t.py", "--json"],
])
def test_a_submitted_commands_json_flag_leaves_usage_errors_as_text(argv, capsys):
    with pytest.raises(SystemExit) as ended:       # (argparse's own way to say a usage error)
        gmux_cli.main(argv)
    assert ended.value.code == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("usage: gmux submit") and "error: argument" in err, (out, err)


@pytest.mark.parametrize("argv", [
    ["--json", "submit", "--gpus", "x", "python", "train.py"],
    ["submit", "--json", "--gpus", "x", "python", "train.py"],
    ["submit", "--gpus", "x", "--json", "python", "train.py"],
    ["submit", "--cluster", "tcp://h:1", "--keys", "k", "--json", "--ranks", "x", "python", "t.py"],
])
def test_gmuxs_own_json_flag_makes_usage_errors_json(argv, capsys):
    assert gmux_cli.main(argv) == 2
    out, err = capsys.readouterr()
    said = json.loads(out)
    assert err == "" and said["status"] == 2 and said["usage"].startswith("usage: gmux submit"), said
