"""gmux-scheduler: the cluster scheduler (see gmux/cluster/scheduler/service.py). Thin: options in, service runs."""
from __future__ import annotations

import argparse
import logging
import os
import signal
import sqlite3
import sys

from gmux.wire import keys
from gmux.cluster.policies import POLICIES, make_policy
from gmux.cluster.scheduler.service import Options, Scheduler
from gmux.cli.argtypes import ckpt_every, json_object, key_name, lost_after, positive, tcp_endpoint
from gmux.util.fd_limit import raise_soft_limit
from gmux.util.text import log_to_stderr


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gmux-scheduler", description="Schedule training jobs across machines "
                                "running gmuxd, with the same policies as gmux-sim.")
    p.add_argument("--listen", type=tcp_endpoint, default="tcp://127.0.0.1:7700",
                   help="TCP endpoint (CurveZMQ) for daemons and clients (default: %(default)s)")
    p.add_argument("--keys", required=True, help="the cluster's key directory (gmux keys --dir DIR --scheduler)")
    p.add_argument("--state", required=True, help="directory for the SQLite state and received checkpoints")
    p.add_argument("--policy", default="gmux", choices=sorted(n for n, c in POLICIES.items() if not c.uses_oracle),
                   help="the scheduling policy (default: %(default)s); sjf, srtf and gmux-law need every job's "
                        "duration in advance and run only in gmux-sim")
    p.add_argument("--params", metavar="JSON", default="{}",
                   help='the policy\'s parameters as a JSON object, e.g. \'{"base_gpu_s": 600}\' for gmux '
                        '(gmux-sim --params takes the same, per policy); a name the policy does not take is refused '
                        '(default: %(default)s, the policy\'s own defaults)')
    p.add_argument("--tick", type=positive, default=1.0,
                   help="seconds between policy decisions (default: %(default)g)")
    p.add_argument("--lost-after", type=lost_after, default=5.0,
                   help="a machine silent this long is lost (default: %(default)g s)")
    p.add_argument("--ckpt-every", type=ckpt_every, default=30.0,
                   help="default periodic checkpoint interval of a job, seconds (0: never; default: "
                        "%(default)g)")
    p.add_argument("--admin", action="append", type=key_name, default=[], metavar="NAME",
                   help="a client key name that may kill or move every user's jobs (repeatable); any other client "
                        "acts only on the jobs it submitted")
    p.add_argument("-v", "--verbose", action="store_true")
    return p


def main(argv=None) -> int:
    p = build_parser()
    a = p.parse_args(argv)
    for flag, where in (("--keys", a.keys), ("--state", a.state)):
        if os.path.exists(where) and not os.path.isdir(where):
            p.error(f"{flag} {where}: a file, not a directory")
    try:
        params = json_object(a.params, "--params", "gmux-scheduler")
        make_policy(a.policy, **params)     # a parameter it does not take is a usage error, as in gmux-sim
    except (ValueError, TypeError) as e:
        p.error(str(e))
    log_to_stderr("gmux-scheduler", a.verbose)
    raise_soft_limit()     # a file per machine and client, and per stranger until its handshake fails
    try:
        s = Scheduler(a.state, a.keys, Options(listen=a.listen, policy=a.policy, params=params, tick=a.tick,
                                               lost_after=a.lost_after, ckpt_every=a.ckpt_every or None,
                                               admins=tuple(a.admin)))
    except (keys.KeyError_, OSError, ValueError) as e:
        print(f"gmux-scheduler: {e}", file=sys.stderr)
        return 1
    except sqlite3.DatabaseError as e:
        db = os.path.join(a.state, "scheduler.db")
        print(f"gmux-scheduler: {db} is damaged or not a gmux-scheduler database ({e}). "
              f"Move it aside to start an empty cluster (the jobs it records are then forgotten)", file=sys.stderr)
        return 1

    def stop(signum, frame):
        s.stopping = True   # jobs keep running on their daemons; a restarted scheduler picks them up
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    logging.info("listening on %s, policy %s", s.endpoint, s.driver.policy.name)
    s.serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
