"""The pool of warm interpreters (gmux.node.warm_pool) and the interpreter itself (gmux.cli.warm), with real
processes: which starts it takes, what a refused or malformed start leaves, and that closing ends the unused."""
import json
import subprocess
import sys

import pytest

from gmux.cli.warm import _spec
from gmux.node.warm_pool import WarmPool, start_time_differences
from gmux_testkit import env


def test_only_variables_read_before_a_script_runs_decide():
    warm = {"PATH": "/bin", "OMP_NUM_THREADS": "1", "HOME": "/home/a", "PYTHONPATH": "/x"}
    assert start_time_differences(warm, {**warm, "PATH": "/usr/bin", "MASTER_PORT": "29500", "HF_TOKEN": "t"}) == []
    assert start_time_differences(warm, {**warm, "OMP_NUM_THREADS": "2"}) == ["OMP_NUM_THREADS"]
    assert start_time_differences(warm, {k: v for k, v in warm.items() if k != "PYTHONPATH"}) == ["PYTHONPATH"]
    assert start_time_differences(warm, {**warm, "LD_PRELOAD": "x.so", "HOME": "/root", "LC_ALL": "C",
                                         "TORCH_LOGS": "+dynamo"}) == ["HOME", "LC_ALL", "LD_PRELOAD", "TORCH_LOGS"]


def test_a_start_with_another_environment_is_refused_and_the_interpreter_kept(tmp_path):
    pool = WarmPool(str(tmp_path / "rt"), str(tmp_path / "logs"), 1, env())
    try:
        pool.fill()
        (p,) = pool.ready
        got, why = pool.take(["--", "python", "x.py"], {**env(), "OMP_NUM_THREADS": "7"}, None, str(tmp_path / "l"))
        assert got is None and "OMP_NUM_THREADS" in why
        assert pool.ready == [p] and p.poll() is None and pool.taken == 0
    finally:
        pool.close()
    assert p.poll() is not None and pool.ready == []
    pool.fill()
    assert pool.ready == []          # a closed pool starts nothing


SCRIPT = """
import json, os, sys
json.dump({"cwd": os.getcwd(), "mark": os.environ.get("GMUX_MARK"), "path0": sys.path[0], "argv": sys.argv,
           "pid": os.getpid()},
          open(sys.argv[1], "w"))
"""


def test_a_start_runs_as_a_job_in_the_warm_interpreter_with_its_directory_environment_and_log(node_factory,
                                                                                             tmp_path):
    """gmux-launch, become this warm process, registers with gmuxd and runs the script as a cold start would:
    in the start's directory (first on sys.path), with its environment, its output in the start's log."""
    node = node_factory("--virtual-gpus", "1x1GiB")
    work = tmp_path / "work"
    work.mkdir()
    (work / "job.py").write_text(SCRIPT)
    pool = WarmPool(node.rt, str(tmp_path / "logs"), 1, env())
    try:
        pool.fill()
        (warm,) = pool.ready
        log = tmp_path / "start.log"
        p, why = pool.take(["--runtime-dir", node.rt, "--name", "w", "--", "python", "job.py", "out.json"],
                           {**env(), "GMUX_MARK": "started"}, str(work), str(log))
        assert why == "warm" and p is warm and pool.taken == 1 and pool.ready == []
        assert p.wait(120) == 0, log.read_text()
        out = json.loads((work / "out.json").read_text())
        assert out["cwd"] == str(work) and out["path0"] == str(work) and out["mark"] == "started"
        assert out["argv"] == ["job.py", "out.json"] and out["pid"] == warm.pid
        jobs = [j for j in node.ps()["jobs"] if j["name"] == "w"]
        assert len(jobs) == 1 and jobs[0]["pid"] == warm.pid and jobs[0]["state"] == "exited"
    finally:
        pool.close()


def test_a_malformed_start_is_refused_by_the_interpreter():
    for line, reason in ((b"[1, 2]", "not a JSON object"),
                         (b'{"argv": ["x"], "env": {}, "cwd": null, "log": "/tmp/x"}', "with -- before"),
                         (b'{"argv": ["--", "p"], "env": {"A": 1}, "cwd": null, "log": "/tmp/x"}', "strings to"),
                         (b'{"argv": ["--", "p"], "env": {}, "cwd": 3, "log": "/tmp/x"}', "cwd must be"),
                         (b'{"argv": ["--", "p"], "env": {}, "cwd": null}', "log must be")):
        with pytest.raises(ValueError, match=reason):
            _spec(line)
    # The real interpreter: a refused start ends it with 2 and the reason; no start at all (the pool closed), 0.
    for line, status in ((b"[1, 2]\n", 2), (b"", 0)):
        done = subprocess.run([sys.executable, "-m", "gmux.cli.warm"], input=line, capture_output=True, cwd="/",
                              env=env(), timeout=120)
        assert done.returncode == status, done.stderr
        assert (b"refused its start: the start is not a JSON object" in done.stderr) == (status == 2), done.stderr
