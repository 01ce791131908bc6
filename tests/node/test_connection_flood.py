"""A user of a system gmuxd who opens connections without end (a hostile one, or a script that leaks clients)
neither stops gmuxd nor cuts off another user: gmuxd raises its limit on open files, and past half of it ends
the flooder's connections (gmux.wire.connection_guard). libzmq aborts gmuxd on the first connection it cannot
take a file for, so without both the flood below ends every user's gmuxd at its 1024th connection.

Skipped unless run as root with useradd/groupadd (as tests/node/test_multi_user.py)."""
from __future__ import annotations

import json
import logging
import os
import random
import resource
import socket

import pytest
from hypothesis import given, settings, strategies as st

from gmux.wire.connection_guard import ConnectionGuard, newest_of_the_largest
from gmux.util.faults import Faults
from gmux.util.fd_limit import open_files
from node_harness import ROOT, wait_for
from test_multi_user import ps, submit_until, system_gmuxd, users  # noqa: F401  (users: throwaway users)

SOFT, HARD = 1024, 8192        # gmuxd's limits as it starts: it may raise its own to 8192, and ends at 2048
MOST = 10000                   # connections the flooder holds at once if it can: more than gmuxd could take
FLOOD = os.path.join(ROOT, "tests", "scripts", "flood.py")     # (user A holds them, from a file A can read)



def test_a_connection_flood_stops_neither_gmuxd_nor_another_users_job(users):
    if resource.getrlimit(resource.RLIMIT_NOFILE)[1] < MOST + 100:
        pytest.skip(f"the flooder needs a hard limit of {MOST + 100} open files to outnumber gmuxd's {HARD}")
    log_path = os.path.join(users.tmp, "rt-flood.log")
    with system_gmuxd(users, "rt-flood", "--virtual-gpus", "2x1GiB",
                      preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (SOFT, HARD))) as (rt, d):
        job, stop, out = submit_until(users, rt, "b", "calm")
        wait_for(lambda: ps(users, rt, "b")[job]["step"] > 0, 120, "B's job did not start training")

        flood = users.popen("a", [users.py, FLOOD, "unix", os.path.join(rt, "gmuxd.sock"), str(MOST), "8"],
                            "flood.out")
        wait_for(lambda: flood.poll() is not None or "ended connections" in open(log_path).read(), 60,
                 "gmuxd ended no connection")
        during = ps(users, rt, "b")[job]       # B is served while A floods
        flood.wait(120)
        assert d.poll() is None, open(log_path).read()[-2000:]
        seen = json.loads(open(os.path.join(users.tmp, "flood.out")).read().splitlines()[-1])
        assert seen["ended"] > 0, seen

        # libzmq's threads, put behind every other process while the flood lasted, have their priority back (that
        # of gmuxd's main thread: the tests may run under `nice`)
        usual = os.getpriority(os.PRIO_PROCESS, d.pid)
        wait_for(lambda: all(nice == usual for nice in zmq_threads_nice(d.pid)), 20,
                 lambda: (usual, zmq_threads_nice(d.pid)))
        after = ps(users, rt, "b")[job]
        assert during["state"] == after["state"] == "running" and after["step"] > during["step"]
        open(stop, "w").close()
        wait_for(lambda: ps(users, rt, "b")[job]["state"] == "exited", 120, "B's job did not end")
        assert ps(users, rt, "b")[job]["exit_status"] == 0 and json.load(open(out))["uid"] == users.uid["b"][0]
    text = open(log_path).read()
    # every connection gmuxd ended was A's (its log counts them by uid, at the latest as it stops)
    assert f"of uid {users.uid['a'][0]}" in text and f"of uid {users.uid['b'][0]}" not in text, text[-2000:]


def zmq_threads_nice(pid: int) -> list:
    found = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/stat") as f:
            stat = f.read()
        if "(ZMQbg/" in stat:
            found.append(int(stat.rsplit(")", 1)[1].split()[16]))     # field 19, nice
    return found


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.integers(0, 5), st.integers(1, 40), min_size=1), st.integers(0, 250))
def test_connections_are_ended_from_the_largest_holder_down_newest_first(held, count):
    by_uid = {uid: [(inode, 1000 + inode) for inode in random.Random(uid).sample(range(10_000), n)]
              for uid, n in held.items()}
    newest = {uid: sorted(conns)[::-1] for uid, conns in by_uid.items()}
    taken = list(newest_of_the_largest(by_uid, count))
    assert len(taken) == min(count, sum(held.values()))
    left = {uid: held[uid] - sum(1 for u, _, _ in taken if u == uid) for uid in held}
    for uid in held:
        mine = [(inode, fd) for u, inode, fd in taken if u == uid]
        assert mine == newest[uid][:len(mine)]          # each holder loses its newest connections first
        if mine:                                        # and only while it holds the most
            assert left[uid] >= max(left.values()) - 1


def test_the_guard_ends_only_connections_to_what_it_watches_from_the_largest_holder(tmp_path):
    """In this process: a TCP listener (a cluster link's port) with 60 connections from 127.0.0.2 and 5 from
    127.0.0.1, and an unwatched one with 30; the guard's marks set just below what the process then holds."""
    guard = ConnectionGuard("gmuxd", str(tmp_path / "gmuxd.sock"), 1 << 16, Faults(logging.getLogger("test")))
    watched, unwatched = (socket.create_server(("127.0.0.1", 0)) for _ in range(2))
    guard.ports.add(watched.getsockname()[1])
    conns = {}
    try:
        for name, listener, source, n in (("flood", watched, "127.0.0.2", 60), ("calm", watched, "127.0.0.1", 5),
                                          ("other", unwatched, "127.0.0.2", 30)):
            conns[name] = []
            for _ in range(n):
                c = socket.create_connection(listener.getsockname(), source_address=(source, 0))
                conns[name].append((c, listener.accept()[0]))
        guard.high = open_files() - 1
        guard.low = guard.high - 40
        ended = guard.check(0.0)
        assert ended == 41

        def cut(pairs):
            out = []
            for client, _ in pairs:
                client.setblocking(False)
                try:
                    out.append(client.recv(1) == b"")
                except BlockingIOError:
                    out.append(False)
            return out
        flood = cut(conns["flood"])
        assert sum(flood) == ended and flood == sorted(flood)   # the newest of the largest holder's
        assert not any(cut(conns["calm"])) and not any(cut(conns["other"]))
        assert guard.check(0.0) == 0      # those ended, not yet closed, are not counted as held again
    finally:
        for pair in (p for pairs in conns.values() for p in pairs):
            for s in pair:
                s.close()
        watched.close()
        unwatched.close()


def test_once_a_flood_is_over_the_heap_it_left_is_given_back(monkeypatch):
    """glibc kept what the flood's connections had held (some 250 KB each: 2.5 GB after 10,000), long after."""
    from gmux.wire import connection_guard
    trims = []
    monkeypatch.setattr(connection_guard.heap, "trim", lambda: trims.append(1) or True)
    guard = ConnectionGuard("gmuxd", None, 1 << 16, Faults(logging.getLogger("test")))
    for held, trimmed in ((guard.low, 0), (guard.high + 1, 0), (guard.high, 0), (guard.low, 1), (guard.low, 1)):
        monkeypatch.setattr(connection_guard, "open_files", lambda: held)
        guard.check(0.0)
        assert len(trims) == trimmed, (held, trims)
