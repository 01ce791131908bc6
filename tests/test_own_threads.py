"""A thread of the script's own reading the job's tensors while a suspend has them off the device: a background
torch.save of the state_dict wrote broken files (207 of 1,133 here) and, under the allocator tier, the process died
(SIGSEGV). Inside `gmux.job.resident()` it holds suspends off and waits out the one under way; where the script's own
threads run beside its loop and none says so, the first suspend warns, naming them."""
import os
import threading

import pytest

from gmux.job import own_threads
from gmux.job.memory import native
from gmux_testkit import run_py

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts", "thread_saves.py")
WARNING = "gmux: the script runs threads of its own beside its training loop (saver)"


@pytest.mark.parametrize("tier", ["state", "allocator"])
def test_saves_of_a_thread_inside_resident_are_whole_across_suspends(tier):
    if tier == "allocator" and not native.available():
        pytest.skip("gmux._native is not built")
    pool = ["--pool", "64MiB"] if tier == "allocator" else []
    out = run_py("-m", "gmux.job.run", *pool, "--cycle-every", "1", SCRIPT, "--resident")
    assert f"120 suspends, {tier} tier" in out.stderr, out.stderr
    assert " saves, 0 broken: []" in out.stdout and WARNING not in out.stderr, (out.stdout, out.stderr)


def test_the_first_suspend_names_the_scripts_own_threads_that_do_not_say_where_they_read():
    out = run_py("-m", "gmux.job.run", "--cycle-every", "1", SCRIPT)
    assert out.stderr.count(WARNING) == 1 and "with gmux.job.resident():" in out.stderr, out.stderr


def test_threads_running_pythons_or_a_librarys_code_are_not_the_scripts():
    stop = threading.Event()

    class Own(threading.Thread):
        def run(self):
            stop.wait(30)

    threads = [threading.Thread(target=stop.wait, args=(30,), name="stdlib"), Own(name="subclass\x1b[2J"),
               threading.Thread(target=lambda: stop.wait(30), name="target"), threading.Timer(30, print)]
    for t in threads:
        t.start()
    try:
        names = own_threads.running()
        assert "subclass\\x1b[2J" in names and "target" in names, names
        assert "stdlib" not in names and threads[3].name not in names, names
    finally:
        stop.set()
        threads[3].cancel()
