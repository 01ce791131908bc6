"""What a submitted job takes from the submitting shell: one allow-list for local and cluster submits."""
from gmux.cli.submit_env import submit_env


def test_submit_env_passes_what_a_script_needs_and_withholds_credentials():
    shell = {"PATH": "/bin", "HOME": "/h", "OMP_NUM_THREADS": "2", "TORCH_HOME": "/t", "GMUX_NATIVE": "0",
             "GMUX_JOB_TOKEN": "secret", "GMUX_RUNTIME_DIR": "/run/me", "GMUX_KEYS": "/k", "AWS_SECRET": "x",
             "LD_PRELOAD": "/evil.so"}
    assert submit_env(shell) == {"PATH": "/bin", "HOME": "/h", "OMP_NUM_THREADS": "2", "TORCH_HOME": "/t",
                                 "GMUX_NATIVE": "0"}
