"""argparse types that refuse bad numbers at the command line, naming what was expected."""
from __future__ import annotations

import argparse
import ipaddress
import json
import math
import os
import re

from gmux.protocol import (MAX_GPU_INDEX, MAX_RANKS, MAX_SECONDS, WEIGHTS, cluster_job_name_problem,
                           job_name_problem)
from gmux.rundir import SOCKET_PATH_MAX, RuntimeDir, not_a_directory
from gmux.util.sizes import parse_size
from gmux.util.text import digits


def checked(convert, noun: str, ok, wanted: str):
    """An argparse type: `convert` the text (else it is not a `noun`), then require `ok(value)` (`wanted`)."""
    def parse(text: str):
        try:
            v = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {noun}") from None
        if not ok(v):
            raise argparse.ArgumentTypeError(f"{text} is not {wanted}")
        return v
    return parse


fraction = checked(float, "a number", lambda v: 0.0 < v <= 1.0, "in (0, 1]")
nonneg = checked(float, "a number", lambda v: 0 <= v < math.inf, "a finite number >= 0")
positive = checked(float, "a number", lambda v: 0 < v < math.inf, "a finite number > 0")
nonneg_int = checked(int, "an integer", lambda v: v >= 0, "an integer >= 0")
positive_int = checked(int, "an integer", lambda v: v >= 1, "a positive integer")
port = checked(int, "a port number", lambda v: 1 <= v <= 65535, "a port in 1..65535")
# A cluster job's checkpoint period: one the wire refuses (gmux-scheduler --ckpt-every 2e6) left every job it
# started unstartable, each start refused by the machine's link.
ckpt_every = checked(float, "a number", lambda v: 0 <= v <= MAX_SECONDS,
                     f"a number of seconds from 0 (never) to {MAX_SECONDS:,.0f}")
# gmux submit --cluster --ranks, gmux migrate --cluster --gpu: the scheduler refused larger ones as wire fields
ranks = checked(int, "an integer", lambda v: 1 <= v <= MAX_RANKS,
                f"a number of ranks from 1 to {MAX_RANKS} (one process per GPU of one machine)")
gpu_index = checked(int, "an integer", lambda v: 0 <= v <= MAX_GPU_INDEX, f"a GPU index from 0 to {MAX_GPU_INDEX}")
# --lost-after: the scheduler sends its shares (a job's lease, a link's fence) in messages the wire bounds alike.
lost_after = checked(float, "a number", lambda v: 0 < v <= MAX_SECONDS,
                     f"a number of seconds > 0 and at most {MAX_SECONDS:,.0f}")
# gmux top --interval: time.sleep took 1e300 with a traceback (OverflowError: timestamp out of range)
interval = checked(float, "a number", lambda v: 0 < v <= MAX_SECONDS,
                   f"a number of seconds > 0 and at most {MAX_SECONDS:,.0f}")
weight = checked(float, "a number", lambda v: WEIGHTS[0] <= v <= WEIGHTS[1], f"a weight in [{WEIGHTS[0]:g}, "
                                                                               f"{WEIGHTS[1]:g}]")


def size(text: str) -> int:
    """A size of memory ('16GiB'), refused in parse_size's words."""
    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


positive_size = checked(size, "a size", lambda v: v > 0, "a size > 0")


def job_memory(text: str) -> int:
    """A job's --mem: a size > 0, where a bare number under a MiB is taken for a missing unit (`--mem 5` was a
    limit of 5 bytes, every allocation of the job refused); `5B` says bytes were meant."""
    n = positive_size(text)
    if n < 1 << 20 and text.strip().isdigit():
        raise argparse.ArgumentTypeError(f"{text} would be {text} bytes: give a unit, e.g. {text.strip()}GiB "
                                         f"(or {text.strip()}B if bytes are meant)")
    return n


def tcp_endpoint(text: str) -> str:
    """tcp://HOST:PORT, the only kind of address cluster mode uses (PORT 0 or *: any free one, where it listens)."""
    host, colon, number = text[len("tcp://"):].rpartition(":") if text.startswith("tcp://") else ("", "", "")
    if not (colon and _host(host) and (number == "*" or digits(number) and int(number) <= 65535)):
        raise argparse.ArgumentTypeError(f"{text!r} is not tcp://HOST:PORT (e.g. tcp://10.0.0.5:7700)")
    return text


def _host(text: str) -> bool:
    """A name, an IPv4 address, * (listening), or an IPv6 address in brackets (tcp://[::1 waited 5 s for nothing)."""
    if text.startswith("[") and text.endswith("]"):
        try:
            ipaddress.IPv6Address(text[1:-1])
        except ValueError:
            return False
        return True
    return bool(re.fullmatch(r"[A-Za-z0-9_.*-]+", text))


def path(text: str) -> str:
    """A file or directory named on the command line: an empty one is a mistake, never "the default"."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path")
    return text


def output_dir(text: str) -> str:
    """A directory results go into (a benchmark's --out), made now and found writable: a run of an hour found it
    was not only at its end, and lost what it had measured."""
    path(text)
    if os.path.exists(text) and not os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text}: a file, not a directory")
    try:
        os.makedirs(text, exist_ok=True)
    except OSError as e:
        raise argparse.ArgumentTypeError(f"{text}: cannot make it ({e.strerror or e})") from None
    if not os.access(text, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"{text}: cannot write into it")
    return text


def runtime_dir(text: str) -> str:
    """--runtime-dir (or GMUX_RUNTIME_DIR, argparse's default): refused where a file stands in the way, which
    would otherwise read as "no gmuxd runs there"."""
    path(text)
    part = not_a_directory(text)
    if part is not None:
        what = ("a file" if os.path.isfile(part) else "a link to nothing" if os.path.islink(part) else
                "a device or a socket")
        raise argparse.ArgumentTypeError(f"{part} is {what}, not a directory (the runtime directory: --runtime-dir "
                                         f"or GMUX_RUNTIME_DIR)")
    # (no gmuxd can serve there, and gmux said "gmuxd is not running ... Start it with `gmuxd --runtime-dir ...`",
    # which gmuxd then refused for this reason)
    socket = len(RuntimeDir(text).socket.encode(errors="surrogateescape"))
    if socket > SOCKET_PATH_MAX:
        raise argparse.ArgumentTypeError(f"runtime directory {text}: its socket's path would be {socket} bytes, over "
                                         f"the {SOCKET_PATH_MAX} a Unix socket allows, so no gmuxd can serve there; "
                                         f"choose a shorter one with --runtime-dir or GMUX_RUNTIME_DIR")
    return text


def job_name(text: str) -> str:
    """--name, --gang: refused at the command line by gmuxd's own rule, in its words (protocol.job_name_problem)."""
    return _named_by(job_name_problem, text)


def key_name(text: str) -> str:
    """A key's NAME (daemon.NAME, client.NAME): gmux-cluster-link --name, gmux-scheduler --admin. A bad one ended
    in a traceback from the key loader, or (--admin '') was taken and could never match a key."""
    from gmux.wire.keys import stem     # (here only: ZeroMQ is imported with it)
    try:
        stem("client", text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def cluster_job_name(text: str) -> str:
    """gmux submit --cluster --name: the scheduler's rule (protocol.cluster_job_name_problem)."""
    return _named_by(cluster_job_name_problem, text)


def _named_by(rule, text: str) -> str:
    problem = rule(text)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return text


def json_object(text: str, flag: str, reader: str) -> dict:
    """A JSON object given on the command line (--params), or ValueError naming the flag and what is wrong."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{flag} is not JSON: {e}") from None
    except RecursionError:
        raise ValueError(f"{flag} is not JSON {reader} reads: nested too deeply") from None
    except ValueError as e:     # (an integer of more digits than Python converts: the error named no flag)
        raise ValueError(f"{flag} is not JSON {reader} reads: {e}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{flag} must be a JSON object ({{...}}), got {type(value).__name__}")
    return value
