"""python -m gmux.cli.cluster_link: a machine's cluster link as its own process, beside an already running gmuxd
(`gmuxd --scheduler ADDR` runs it as a thread instead)."""
from __future__ import annotations

import argparse
import sys

from gmux.node.cluster_link import ClusterLink
from gmux.rundir import RuntimeDirError
from gmux.util.text import log_to_stderr


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="gmux-cluster-link")
    p.add_argument("--runtime-dir", required=True)
    p.add_argument("--name", required=True, help="this machine's name: its key is daemon.NAME in --keys")
    p.add_argument("--scheduler", required=True, help="tcp://HOST:PORT of gmux-scheduler")
    p.add_argument("--keys", required=True, help="the cluster's key directory")
    p.add_argument("--listen", default="tcp://127.0.0.1:0", help="where checkpoints arrive from other machines")
    a = p.parse_args(argv)
    log_to_stderr("cluster-link")
    try:
        link = ClusterLink(a.runtime_dir, a.name, a.scheduler, a.keys, a.listen)
    except RuntimeDirError as e:
        p.error(str(e))
    link.serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
