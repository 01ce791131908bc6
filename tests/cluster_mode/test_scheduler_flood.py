"""Anyone on the network may open connections to gmux-scheduler's ports (its Curve port holds one until its
handshake times out, its bulk port, which needs no key, for ever): at its limit on open files it could list no
directory, and its loop ended, leaving every machine to suspend its jobs until someone started it again. It ends
the connections of whoever holds the most, by address (gmux.wire.connection_guard)."""
from __future__ import annotations

import json
import os
import resource
import subprocess
import sys

import pytest

from cluster_harness import cluster_factory  # noqa: F401
from gmux_testkit import ROOT, wait_for

MOST = 6000      # connections the flood holds at once if it can: more than the scheduler's 4096 files
FLOOD = os.path.join(ROOT, "tests", "scripts", "flood.py")



def test_a_flood_from_the_network_does_not_stop_the_scheduler(cluster_factory):  # noqa: F811
    if resource.getrlimit(resource.RLIMIT_NOFILE)[1] < MOST + 100:
        pytest.skip(f"the flooder needs a hard limit of {MOST + 100} open files")
    c = cluster_factory(machines=(), sched_files=(1024, 4096))
    flood = subprocess.Popen([sys.executable, FLOOD, "tcp", str(c.port), "127.0.0.2", str(MOST), "10"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: flood.poll() is not None or "ended connections to gmux-scheduler (" in
             (c.tmp / "scheduler.log").read_text(), 60, "the scheduler's log")
    during = c.ps(timeout=30)       # a client's new connection, while the flood holds what it can
    out, err = flood.communicate(timeout=120)
    assert flood.returncode == 0, err
    assert c.sched.poll() is None, (c.tmp / "scheduler.log").read_text()[-2000:]
    assert json.loads(out)["ended"] > 0, out
    assert "of 127.0.0.2" in (c.tmp / "scheduler.log").read_text()
    after = c.ps()
    assert during["jobs"] == after["jobs"] == [] and after["internal_errors"] == 0, after
