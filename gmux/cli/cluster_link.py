"""python -m gmux.cli.cluster_link: a machine's cluster link as its own process, beside an already running gmuxd
(`gmuxd --scheduler ADDR` runs it as a thread instead)."""
from __future__ import annotations

import argparse
import sys

import zmq

from gmux.cli.argtypes import key_name, runtime_dir, tcp_endpoint
from gmux.node.cluster_link import ClusterLink
from gmux.rundir import RuntimeDirError
from gmux.util.text import log_to_stderr, printable
from gmux.wire import keys


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="gmux-cluster-link")
    p.add_argument("--runtime-dir", type=runtime_dir, required=True, help="the runtime directory of this machine's "
                   "gmuxd (gmuxd --runtime-dir)")
    p.add_argument("--name", type=key_name, required=True,
                   help="this machine's name: its key is daemon.NAME in --keys")
    p.add_argument("--scheduler", type=tcp_endpoint, required=True, help="tcp://HOST:PORT of gmux-scheduler")
    p.add_argument("--keys", required=True, help="the cluster's key directory")
    p.add_argument("--listen", type=tcp_endpoint, default="tcp://127.0.0.1:0",
                   help="where checkpoints arrive from other machines (default: %(default)s, any free port)")
    a = p.parse_args(argv)
    log_to_stderr("cluster-link")
    try:
        link = ClusterLink(a.runtime_dir, a.name, a.scheduler, a.keys, a.listen)
    except RuntimeDirError as e:
        p.error(str(e))
    except (keys.KeyError_, OSError, zmq.ZMQError) as e:
        # (a missing key, a runtime directory that cannot hold the link's files, an address taken or not this
        # machine's: each ended in a traceback)
        print(f"gmux-cluster-link: {printable(e)}", file=sys.stderr)
        return 1
    link.serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
