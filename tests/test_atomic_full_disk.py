"""A file written atomically on a disk that fills up mid-write fails whole: it is never renamed into place short.

A raw write may write only part of what it is given (a filling disk does so, before it says ENOSPC), and the
writers took each write as whole: a spill to a nearly full disk renamed a truncated file into place, freed the
job's host copy, and every resume then failed on the short file (an outside tester: a neighbour on a shared
machine filling the disk lost another user's training state). A file-size limit (RLIMIT_FSIZE) makes the
kernel write short the same way, without a full disk."""
import os
import subprocess
import sys

import pytest

WRITERS = {
    "spill": "from gmux.job.memory.spill import SpillFile\n"
             "SpillFile.write(PATH, np.frombuffer(os.urandom(3 << 20), dtype=np.uint8))",
    "write_atomic": "from gmux.util.atomic import write_atomic\nwrite_atomic(PATH, os.urandom(3 << 20))",
    "checkpoint": "import torch\nfrom gmux.job import checkpoint\n"
                  "checkpoint.save({'w': torch.arange(1 << 20, dtype=torch.float32)}, PATH)",
}


@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_a_write_cut_short_by_the_disk_fails_and_leaves_no_file(writer, tmp_path):
    path = tmp_path / "out.bin"
    script = ("import os, resource, signal\nimport numpy as np\n"
              "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
              "resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, resource.RLIM_INFINITY))\n"
              f"PATH = {str(path)!r}\n" + WRITERS[writer] + "\nprint('WRITTEN')\n")
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert "WRITTEN" not in r.stdout, f"a write cut short at 1 MiB was taken as whole: {os.path.getsize(path)} B"
    assert r.returncode != 0 and "File too large" in r.stderr, r.stderr[-2000:]
    assert not path.exists() and os.listdir(tmp_path) == []      # (and no partial left beside it)
