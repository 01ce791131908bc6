"""`python -m gmux.job.run`'s command line refuses bad numbers in one line, before the script runs."""
import os

import pytest

from gmux_testkit import ROOT, run_py

SCRIPT = os.path.join(ROOT, "tests", "scripts", "state_and_grab.py")


@pytest.mark.parametrize("args, said", [
    (["--cycle-every", "-1"], "--cycle-every: -1 is not an integer >= 0"),           # was a ValueError traceback
    (["--cycle-every", "2", "--hold", "nan"], "--hold: nan is not a finite number >= 0"),  # tracebacks from inside
    (["--cycle-every", "2", "--hold", "-1"], "--hold: -1 is not a finite number >= 0"),    # the job, after its first
    (["--cycle-every", "2", "--hold", "inf"], "--hold: inf is not a finite number >= 0"),  # suspend
    (["--mem", "0"], "--mem: 0 is not a size > 0"),                                   # was taken for no limit
    (["--pool", "0"], "--pool: 0 is not a size > 0"),                                 # was taken for no pool
    (["--pool", "99999GiB"], "--pool: 99999GiB is more than this machine's memory"),  # was faulted in: the OOM killer
])
def test_bad_numbers_are_refused_in_one_line_before_the_script_runs(args, said):
    proc = run_py("-m", "gmux.job.run", *args, SCRIPT, "8", "20", check=False, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and said in proc.stderr, proc.stderr
    assert proc.stdout == "", proc.stdout
