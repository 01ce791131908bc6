"""What a submitted job takes from the submitting shell: one allow-list for local and cluster submits."""
from gmux.cli.submit_env import submit_env


def test_submit_env_passes_what_a_script_needs_and_withholds_credentials():
    shell = {"PATH": "/bin", "HOME": "/h", "OMP_NUM_THREADS": "2", "TORCH_HOME": "/t", "GMUX_NATIVE": "0",
             "GMUX_JOB_TOKEN": "secret", "GMUX_RUNTIME_DIR": "/run/me", "GMUX_JOB_ID": "j3", "GMUX_KEYS": "/k", "AWS_SECRET": "x",
             "LD_PRELOAD": "/evil.so"}
    assert submit_env(shell) == {"PATH": "/bin", "HOME": "/h", "OMP_NUM_THREADS": "2", "TORCH_HOME": "/t",
                                 "GMUX_NATIVE": "0"}


def test_determinism_settings_pass_and_a_submit_that_cannot_start_is_refused(tmp_path, monkeypatch):
    """PYTHONHASHSEED and CUBLAS_WORKSPACE_CONFIG were replaced by gmuxd's; a missing script was accepted and
    failed in the job's log; bytes that are not UTF-8 gave a msgpack traceback."""
    import os

    import pytest

    from gmux.cli.submit_env import check_text, submit_cwd
    env = submit_env({"PYTHONHASHSEED": "0", "CUBLAS_WORKSPACE_CONFIG": ":4096:8", "NCCL_DEBUG": "WARN",
                      "MYVAR": "x"})
    assert env == {"PYTHONHASHSEED": "0", "CUBLAS_WORKSPACE_CONFIG": ":4096:8", "NCCL_DEBUG": "WARN"}
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("pass\n")
    os.mkdir(tmp_path / "adir.py")
    assert submit_cwd(["python", "train.py"]) == str(tmp_path)
    for argv, needle in ((["python", "missing.py"], f"no script 'missing.py' in {tmp_path}"),
                         (["missing.py", "--lr", "1"], "no script 'missing.py'"),
                         (["python", "adir.py"], "'adir.py' is not a file")):
        with pytest.raises(ValueError, match=needle):
            submit_cwd(argv)
    assert submit_cwd(["python", "missing.py"], here=False) == str(tmp_path)    # (a cluster's machine has it)
    assert submit_cwd(["python", "-m", "no.such.module"]) == str(tmp_path)      # found only as the job starts
    bad = os.fsdecode(b"data-\xff.bin")
    check_text(["python", "train.py", "--data", "ok"], {"LANG": "C.UTF-8"}, str(tmp_path))
    for argv, env, cwd, needle in ((["python", "train.py", "--data", bad], {}, "/w", "argument 4 is not UTF-8 text"),
                                   (["python", "train.py"], {"HF_HOME": bad}, "/w", "variable HF_HOME is not UTF-8"),
                                   (["python", "train.py"], {}, "/w/" + bad, "the directory is not UTF-8 text")):
        with pytest.raises(ValueError, match=needle) as e:
            check_text(argv, env, cwd)
        assert "\\xff" in str(e.value)


def test_gmux_launch_names_the_directory_a_script_is_missing_from(tmp_path):
    """A cluster job whose script its machine lacks was held saying "no script 'x.py' in ." (the machine's
    directory, unnamed)."""
    import os
    import subprocess
    import sys
    from gmux_testkit import env
    p = subprocess.run([sys.executable, "-m", "gmux.cli.launch", "--runtime-dir", str(tmp_path / "rt"), "--",
                        "python", "x.py"], cwd=tmp_path, env=env(), capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and f"gmux-launch: no script 'x.py' in {tmp_path}" in p.stderr, p.stderr
    assert not os.path.exists(tmp_path / "rt")      # (refused before anything was made)
