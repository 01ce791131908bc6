"""GPU inventory and the launcher's reading of a command line: pure functions, refusals that say what to write."""
import logging
import sys

import pytest

from gmux.node.inventory import discover, gpu_list, parse_virtual_gpus
from gmux.util.sizes import format_size, parse_size
from gmux.util.job_command import script_of


def test_sizes():
    assert parse_size("16GiB") == 16 << 30
    assert parse_size("512MiB") == 512 << 20
    assert parse_size("1.5G") == 3 << 29
    assert parse_size("2GB") == 2 * 1000 ** 3
    assert parse_size("123") == 123
    for bad in ("", "GiB", "-1GiB"):
        with pytest.raises(ValueError, match="write e.g."):
            parse_size(bad)
    # (a hostile tester's: "99999999999EiB is not a size" when the unit was the problem; 1.5B taken as 1 byte)
    with pytest.raises(ValueError, match="'parsecs' is not a unit of size; write B, KiB"):
        parse_size("12 parsecs")
    with pytest.raises(ValueError, match="'1.5B' is not a whole number of bytes"):
        parse_size("1.5B")
    assert parse_size("1.1KiB") == 1126
    assert format_size(3 << 29) == "1.5GiB" and format_size(None) == "-"


def test_virtual_gpus():
    assert parse_virtual_gpus("2x16GiB") == [16 << 30] * 2
    assert parse_virtual_gpus("8GiB,1x16GiB") == [8 << 30, 16 << 30]
    with pytest.raises(ValueError):
        parse_virtual_gpus("0x16GiB")
    with pytest.raises(ValueError, match=r"memory too, e.g. 2x16GiB"):     # a count alone is not 2 bytes
        parse_virtual_gpus("2")
    # A machine's GPUs in a refusal: "this machine has 0" read as no GPU at all
    assert (gpu_list([0]), gpu_list([1, 0])) == ("GPU 0 only", "GPUs 0, 1")
    gpus = discover("2x1GiB")
    assert [(g.index, g.virtual, g.mem_total) for g in gpus] == [(0, True, 1 << 30), (1, True, 1 << 30)]
    assert gpus[1].env() == {"CUDA_VISIBLE_DEVICES": "", "GMUX_VIRTUAL_GPU": "1", "GMUX_GPU_MEM": str(1 << 30)}


def test_no_nvml_gpu_falls_back_to_virtual():
    # This machine has no GPU (or no driver): NVML finds none and gmuxd still comes up, on virtual GPUs.
    from gmux.node.inventory import nvml_gpus
    if nvml_gpus():
        pytest.skip("a real GPU is present")
    gpus = discover(None, default_virtual="1x2GiB")
    assert len(gpus) == 1 and gpus[0].virtual and gpus[0].mem_total == 2 << 30


def test_script_of():
    assert script_of(["python", "train.py", "--lr", "1"]) == ("path", "train.py", ["train.py", "--lr", "1"])
    assert script_of(["python3", "-u", "train.py"]) == ("path", "train.py", ["train.py"])
    assert script_of(["python", "-m", "pkg.train", "x"]) == ("module", "pkg.train", ["pkg.train", "x"])
    assert script_of(["train.py", "a"]) == ("path", "train.py", ["train.py", "a"])
    with pytest.raises(ValueError, match="python -c"):
        script_of(["python", "-c", "print(1)"])
    with pytest.raises(ValueError, match="Write: -- python train.py ARGS"):
        script_of(["bash", "run.sh"])


def test_interpreter_options_take_their_values_and_reach_the_jobs_process():
    """`python -W ignore train.py` was refused ("ignore" taken for the script) and -u was dropped."""
    from gmux.util.job_command import interpreter_options
    argv = ["python", "-u", "-W", "ignore", "-X", "faulthandler", "-S", "-Xdev", "train.py", "-W", "x"]
    assert script_of(argv) == ("path", "train.py", ["train.py", "-W", "x"])
    assert interpreter_options(argv) == ["-u", "-W", "ignore", "-X", "faulthandler", "-Xdev"]    # (-S: dropped)
    assert interpreter_options(["train.py", "-u"]) == [] and interpreter_options(["python", "-m", "m", "-u"]) == []
    assert interpreter_options(["python", "-Wignore::UserWarning", "-Xint_max_str_digits=0", "t.py"]) == \
        ["-Wignore::UserWarning", "-Xint_max_str_digits=0"]     # (an i or a c in their values is no flag)
    for argv, needle in ((["python", "-W"], "python -W needs a value"), (["python", "-"], "read from stdin"),
                         (["python", "-uc", "print(1)"], "not python -c"), (["python", "-i", "t.py"], "leave out -i"),
                         (["python3", "-ui", "t.py"], "python -i: a job runs unattended")):
        with pytest.raises(ValueError, match=needle):
            script_of(argv)


def test_a_command_that_is_not_python_is_refused_before_it_starts(tmp_path):
    """`-- ./t.sh`, `-- /bin/bash -c ...` and `-- /usr/bin/env python x.py` were accepted and failed in the job's
    log with "SyntaxError: source code string cannot contain null bytes"."""
    import os

    from gmux.util.job_command import missing_script
    (tmp_path / "t.sh").write_text("#!/bin/bash\necho hi\n")
    (tmp_path / "train").write_text("#!/usr/bin/env python3\nprint(1)\n")
    (tmp_path / "plain").write_text("print(1)\n")
    for argv, needle in ((["./t.sh"], "a script for '/bin/bash', not Python"),
                         (["/bin/bash", "-c", "echo"], "a program, not a Python script"),
                         (["/usr/bin/env", "python", "x.py"], "a program, not a Python script")):
        kind, target, _ = script_of(argv, str(tmp_path))
        assert needle in missing_script(kind, target, str(tmp_path)) and "Write: -- python train.py" in \
            missing_script(kind, target, str(tmp_path))
    for ok in ("train", "plain"):
        assert missing_script(*script_of([f"./{ok}"], str(tmp_path))[:2], str(tmp_path)) is None
    assert os.path.exists(tmp_path / "t.sh")


def test_a_directory_given_as_the_script_is_said_to_be_a_directory(tmp_path):
    """`-- python /tmp` was answered "a job is a Python training script; got ['python', '/tmp']. Write: -- python
    train.py ARGS", which is what the user wrote: the words never said that /tmp is a directory."""
    for argv in (["python", str(tmp_path)], [str(tmp_path)]):
        with pytest.raises(ValueError, match=r"is a directory, not a script"):
            script_of(argv, str(tmp_path))


class _Nvml:
    """pynvml's calls that Readings makes, answering from `used` (bytes per GPU index); `broken` makes every
    call raise as a driver gone away does. (No GPU result is claimed: this is gmuxd's use of the answers.)"""

    def __init__(self):
        self.used = {0: 5 << 30}
        self.broken = False
        self.inits = self.reads = 0

    def _check(self):
        if self.broken:
            raise RuntimeError("Driver Not Loaded")

    def nvmlInit(self):
        self._check()
        self.inits += 1

    def nvmlShutdown(self):
        self._check()

    def nvmlDeviceGetHandleByIndex(self, i):
        self._check()
        return i

    def nvmlDeviceGetMemoryInfo(self, h):
        self.reads += 1
        return type("Memory", (), {"used": self.used[h]})

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        return [type("Process", (), {"pid": 4321, "usedGpuMemory": self.used[h]})]


def test_ps_memory_in_use_is_read_now_not_at_start(monkeypatch, caplog):
    # gmux ps showed a real GPU's memory in use as NVML read it when gmuxd started, for ever after.
    from gmux.node.inventory import Gpu, Readings
    nvml = _Nvml()
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    real, virtual = Gpu(0, "H100", 80 << 30, False, "GPU-0", mem_used=1 << 30), Gpu(1, "virtual", 1 << 30, True)
    readings = Readings([real, virtual], every_s=1.0)
    readings.refresh(100.0)
    assert real.mem_used == 5 << 30 and real.processes == [{"pid": 4321, "mem": 5 << 30}]
    assert virtual.mem_used is None and nvml.inits == 1
    nvml.used[0] = 7 << 30
    readings.refresh(100.5)             # a ps loop does not hold gmuxd on the driver
    assert real.mem_used == 5 << 30 and nvml.reads == 1
    readings.refresh(101.0)
    assert real.mem_used == 7 << 30 and nvml.inits == 1      # NVML stays open between reads
    # The driver goes away: unknown, not the last figure shown as now; said once, and again when it is back.
    nvml.broken = True
    with caplog.at_level(logging.WARNING, "gmux.inventory"):
        readings.refresh(102.0)
        readings.refresh(103.0)
        assert real.mem_used is None and real.processes == []
        nvml.broken = False
        nvml.used[0] = 3 << 30
        readings.refresh(104.0)
    assert real.mem_used == 3 << 30 and nvml.inits == 2
    said = [r.getMessage() for r in caplog.records]
    assert len([m for m in said if "cannot be read" in m]) == 1 and "NVML can be read again" in said
    # Virtual GPUs alone: NVML is never asked.
    quiet = _Nvml()
    monkeypatch.setitem(sys.modules, "pynvml", quiet)
    Readings([Gpu(0, "virtual", 1 << 30, True)]).refresh(0.0)
    assert quiet.inits == 0
