"""gmuxd: the per-machine GPU multiplexer daemon."""
from __future__ import annotations

import argparse
import grp
import logging
import os
import signal
import sys
import threading

from gmux.cli.argtypes import checked, nonneg, nonneg_int, port, positive, positive_int, size, tcp_endpoint
from gmux.cli.output import NEGATIVE_NUMBER
from gmux.node.access import SystemMode
from gmux.node.daemon import Daemon, Options
from gmux.node.inventory import discover
from gmux.node.pacing import Pacing
from gmux.util.fd_limit import raise_soft_limit
from gmux.util.text import digits, log_to_stderr, printable
from gmux.rundir import SYSTEM_RUNTIME_DIR, RuntimeDir, private_runtime_dir

LOW_FILE_LIMIT = 16384    # gmux.wire.connection_guard ends connections past a quarter of it


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="gmuxd", description="Time-slice, pack and migrate training jobs on this "
                                                          "machine's GPUs.")
    p._negative_number_matcher = NEGATIVE_NUMBER    # (--host-budget -1GiB: refused by its check, not "expected one
    #                                                  argument", as gmux's Parser does)
    p.add_argument("--runtime-dir", help="dir for socket, db, logs (default: a private one of yours, "
                                         f"{SYSTEM_RUNTIME_DIR} with --system)")
    p.add_argument("--system", action="store_true",
                   help="serve every member of --socket-group through one socket, as root: users act on their own "
                        "jobs (told apart by the kernel), admins on all, and jobs run as their users "
                        "(docs/security.md, contrib/systemd/gmuxd.service)")
    p.add_argument("--socket-group", help="with --system: the group that may use gmuxd (default gmux)")
    p.add_argument("--admin-group", help="with --system: members of this group may act on every job (root "
                                         "always may)")
    p.add_argument("--virtual-gpus", help="e.g. 2x16GiB: virtual GPUs (jobs compute on the CPU); automatic "
                                          "when NVML finds no GPU")
    p.add_argument("--quantum", type=positive, default=60.0, help="time-slice quantum in seconds (default 60)")
    p.add_argument("--deadline-floor", type=positive, default=Pacing.floor, metavar="SECONDS",
                   help="the least time a job told to suspend or resume has to reach a mini-batch boundary before "
                        "it is stopped (SIGSTOP) instead; a job's own deadline is 3 of its mini-batches where "
                        f"longer (default {Pacing.floor:g}; more on a machine so loaded that jobs miss it)")
    p.add_argument("--host-budget", type=size, default="8GiB",
                   help="host RAM for suspended jobs' state; beyond it state spills to disk (default 8GiB; 0: "
                        "every suspended job's state goes to disk)")
    p.add_argument("--no-pack", dest="pack", action="store_false", help="never pack jobs; only time-slice")
    p.add_argument("--pack-margin", type=nonneg, default=0.1, help="keep a pack if sum of packed/solo rates > 1+margin")
    p.add_argument("--pack-window", type=positive, default=5.0, help="seconds of packed measurement before judging")
    p.add_argument("--pack-recheck", type=positive, default=1800.0,
                   help="seconds a kept pack runs together before it is measured again: each job alone for two "
                        "turns, then together (default 1800)")
    p.add_argument("--metrics-port", type=port, help="serve Prometheus metrics on this port (127.0.0.1)")
    p.add_argument("--scheduler", type=tcp_endpoint,
                   help="cluster mode: gmux-scheduler's tcp://HOST:PORT (needs --keys and --name)")
    p.add_argument("--keys", help="cluster mode: the cluster's key directory (gmux keys)")
    p.add_argument("--name", help="cluster mode: this machine's name (its key is daemon.NAME)")
    p.add_argument("--listen", type=tcp_endpoint, default="tcp://127.0.0.1:0",
                   help="cluster mode: where checkpoints from other machines arrive (default: a free loopback port)")
    p.add_argument("--warm-starts", type=nonneg_int, default=1, metavar="N",
                   help="cluster mode: interpreters kept with torch imported for the next starts here (a move's "
                        "target, a restart), each taking a start's first seconds off; 0: none (default 1)")
    p.add_argument("--keep-ended", type=positive_int, default=1000,
                   help="ended jobs kept in the job table, newest first (default 1000; older ones stay in SQLite)")
    p.add_argument("--log-limit", type=checked(size, "a size", lambda v: v >= 1 << 20, "a size >= 1MiB"),
                   default="256MiB", metavar="SIZE",
                   help="bytes a submitted job's log may hold: past it, the newest half is kept behind a line saying "
                        "how much was dropped (default 256MiB)")
    p.add_argument("--retain-ended", type=positive, default=30.0, metavar="DAYS",
                   help="days an ended job stays in SQLite (default 30)")
    p.add_argument("--rebind-gpus", action="store_true",
                   help="move jobs between this machine's real GPUs in their own process: the CUDA driver (580 or "
                        "later) moves a suspended job's CUDA state onto a GPU of the same chip. Without it such a "
                        "move is a checkpoint and a new process")
    p.add_argument("-v", "--verbose", action="store_true")
    a = p.parse_args(argv)
    if a.scheduler and not (a.keys and a.name):
        p.error("--scheduler needs --keys DIR and --name NAME")
    for flag, given in (("--name", a.name), ("--keys", a.keys)):
        if given is not None and not a.scheduler:
            p.error(f"{flag} is for cluster mode: it needs --scheduler tcp://HOST:PORT")
    if a.socket_group is not None and not a.system:
        p.error("--socket-group is for --system (a per-user gmuxd's socket is its user's alone)")
    system = _system_mode(p, a) if a.system else None
    if a.admin_group and not a.system:
        p.error("--admin-group is for --system (a per-user gmuxd's admin is its user)")
    if a.runtime_dir is not None and not a.runtime_dir.strip():
        p.error("--runtime-dir: an empty path")
    # absolute: its jobs' launchers are handed it, and they run in their submitter's directory
    a.runtime_dir = os.path.abspath(a.runtime_dir or os.environ.get("GMUX_RUNTIME_DIR") or (
        SYSTEM_RUNTIME_DIR if a.system else private_runtime_dir()))
    log_to_stderr("gmuxd", a.verbose)
    files = raise_soft_limit()
    if files < LOW_FILE_LIMIT:
        logging.warning("gmuxd may hold only %d open files (its hard limit): a user of its socket who opens "
                        "connections faster than it ends them could stop it; raise the hard limit (ulimit -Hn, "
                        "or LimitNOFILE in its systemd unit) to %d or more", files, LOW_FILE_LIMIT)
    try:
        gpus = discover(a.virtual_gpus)
    except ValueError as e:
        p.error(f"--virtual-gpus {printable(e)}")
    driver = None
    if a.rebind_gpus and any(not g.virtual for g in gpus):
        from gmux.node.cuda_rebind import CudaDriver, Unavailable
        try:
            driver = CudaDriver.load()
        except Unavailable as e:
            print(f"gmuxd: --rebind-gpus: {e}", file=sys.stderr)
            return 1
    elif a.rebind_gpus:
        logging.info("--rebind-gpus: this machine's GPUs are virtual, and their jobs move in their own process "
                     "anyway")
    try:
        daemon = Daemon(RuntimeDir(a.runtime_dir), gpus, rebind=driver, options=
                        Options(quantum=a.quantum, host_budget=a.host_budget, pack=a.pack, margin=a.pack_margin,
                                window=a.pack_window, recheck=a.pack_recheck, metrics_port=a.metrics_port,
                                keep_ended=a.keep_ended, retain_ended=a.retain_ended * 86400, system=system,
                                log_limit=a.log_limit, pacing=Pacing(floor=a.deadline_floor)))
    except (RuntimeError, PermissionError, OSError) as e:
        print(f"gmuxd: {e}", file=sys.stderr)
        return 1

    def stop(signum, frame):
        logging.info("%s: stopping; the jobs run on, and a gmuxd started on %s takes them back",
                     signal.Signals(signum).name, a.runtime_dir)
        daemon.stopping = True   # jobs keep running; a restarted gmuxd re-attaches to them
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    logging.info("serving %s with %d GPU(s): %s", daemon.rundir.endpoint, len(gpus),
                 ", ".join(f"{g.index}:{g.name} {g.mem_total >> 20}MiB" for g in gpus))
    if a.scheduler:   # the cluster link: its own thread and sockets, talks to this daemon as an admin client
        from gmux.node.cluster_link import ClusterLink
        try:
            link = ClusterLink(a.runtime_dir, a.name, a.scheduler, a.keys, a.listen, a.warm_starts)
        except Exception as e:
            daemon.close()
            print(f"gmuxd: cluster link: {e}", file=sys.stderr)
            return 1
        # (strangers may connect to both: the guard ends their connections too once there are too many)
        daemon.connections.ports.update({int(link.transfer_endpoint.rsplit(":", 1)[1]), link.receiver.bulk_port})
        threading.Thread(target=link.serve, name="cluster-link", daemon=True).start()
        logging.info("cluster link to %s as %s; checkpoints arrive at %s", a.scheduler, a.name,
                     link.transfer_endpoint)
    daemon.serve()
    return 0


def _system_mode(p: argparse.ArgumentParser, a: argparse.Namespace) -> SystemMode:
    if os.geteuid() != 0:
        p.error("--system runs as root: it starts each user's jobs as that user (run it from "
                "contrib/systemd/gmuxd.service, or without --system for a daemon of your own)")
    if a.scheduler:
        # the cluster link would read users' checkpoint files as root and send them off this machine
        p.error("--system with --scheduler is not supported yet: run a per-user gmuxd in cluster mode")
    groups = {}
    for flag, name in (("--socket-group", a.socket_group or "gmux"), ("--admin-group", a.admin_group)):
        if name is None:
            continue
        try:
            groups[flag] = grp.getgrgid(int(name)).gr_gid if digits(name) else grp.getgrnam(name).gr_gid
        except KeyError:
            p.error(f"{flag} {name}: no such group (create it, e.g. `groupadd {name}`, and add its users)")
    return SystemMode(groups["--socket-group"], groups.get("--admin-group"))


if __name__ == "__main__":
    sys.exit(main())
