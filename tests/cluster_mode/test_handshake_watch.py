"""A machine that cannot get through to the scheduler says why in its log, once, instead of retrying in silence:
its key refused, the scheduler's key it holds wrong, or nobody answering; a good handshake says nothing (and,
after a warning, that it is through)."""
import logging
import os
import shutil
import time

import pytest
import zmq

from cluster_harness import free_port, wait_for
from gmux.wire import handshake_watch, keys
from gmux.wire.handshake_watch import HandshakeWatch


@pytest.fixture
def world(tmp_path):
    server_keys, client_keys = str(tmp_path / "server"), str(tmp_path / "client")
    keys.create(server_keys, "scheduler")
    keys.create(client_keys, "daemon", "m1")
    os.makedirs(client_keys, exist_ok=True)
    shutil.copy(os.path.join(server_keys, "scheduler.pub"), client_keys)
    ctx = zmq.Context()
    made = []

    def server():
        guard = keys.Guard(ctx, server_keys, ("daemon",))
        s = keys.server_socket(ctx, zmq.ROUTER, server_keys, "scheduler")
        s.setsockopt(zmq.LINGER, 0)
        endpoint = f"tcp://127.0.0.1:{free_port()}"
        s.bind(endpoint)
        made.append((s, guard))
        server.socket = s
        return endpoint

    def client(endpoint, server_key_from=client_keys):
        c = keys.client_socket(ctx, zmq.DEALER, client_keys, "daemon", "m1",
                               keys.load_public(server_key_from, "scheduler"))
        c.setsockopt(zmq.LINGER, 0)
        c.setsockopt(zmq.RECONNECT_IVL_MAX, 200)
        w = HandshakeWatch(c, endpoint, "scheduler", "daemon.m1", "scheduler")
        c.connect(endpoint)
        made.append((c, w))
        return w

    yield server_keys, client_keys, server, client
    for sock, other in made:
        other.stop() if isinstance(other, keys.Guard) else other.close()
        sock.close(0)
    ctx.term()


def _watch(w, seconds):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if w.socket.poll(50):
            w.handle()
        w.check()


def test_each_reason_a_machine_cannot_join_is_said_once(world, caplog, monkeypatch):
    server_keys, client_keys, server, client = world
    monkeypatch.setattr(handshake_watch, "SILENCE_S", 1.0)
    monkeypatch.setattr(handshake_watch, "RETRY_S", 1.0)
    caplog.set_level(logging.INFO, logger="gmux.handshake")
    endpoint = server()
    # Its key is not in the scheduler's directory.
    w = client(endpoint)
    _watch(w, 2.0)
    said = [r.getMessage() for r in caplog.records]
    assert said == [f"the scheduler at {endpoint} refused this party's key (daemon.m1.pub, status 400): is that "
                    f"file in the scheduler's key directory? (tried again every 1 s)"] and not w.joined, said
    # Authorised (read again at the next handshake, which is tried again): it gets through and says so.
    shutil.copy(os.path.join(client_keys, "daemon.m1.pub"), server_keys)
    wait_for(lambda: _watch(w, 0.3) or w.joined, 10, "the handshake after the key was added")
    assert caplog.records[-1].getMessage() == f"the scheduler at {endpoint} accepted us: connected"


def test_a_wrong_scheduler_key_and_nobody_there_are_said(world, caplog, monkeypatch, tmp_path):
    server_keys, client_keys, server, client = world
    monkeypatch.setattr(handshake_watch, "SILENCE_S", 1.0)
    caplog.set_level(logging.INFO, logger="gmux.handshake")
    shutil.copy(os.path.join(client_keys, "daemon.m1.pub"), server_keys)
    other = str(tmp_path / "other")
    keys.create(other, "scheduler")
    endpoint = server()
    w = client(endpoint, server_key_from=other)         # holds another scheduler's key
    _watch(w, 2.0)
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and not w.joined, said
    assert said[0] == (f"the CurveZMQ handshake with the scheduler at {endpoint} failed: does the scheduler.pub here "
                       f"match the scheduler's own key?"), said
    caplog.clear()
    nobody = f"tcp://127.0.0.1:{free_port()}"
    w = client(nobody)
    _watch(w, 2.0)
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and said[0].startswith(f"no answer from the scheduler at {nobody} after 1 s "
                                                 f"(connection refused or unreachable"), said


def test_a_good_handshake_says_nothing(world, caplog, monkeypatch):
    server_keys, client_keys, server, client = world
    monkeypatch.setattr(handshake_watch, "SILENCE_S", 1.0)
    caplog.set_level(logging.INFO, logger="gmux.handshake")
    shutil.copy(os.path.join(client_keys, "daemon.m1.pub"), server_keys)
    w = client(server())
    _watch(w, 2.0)
    assert w.joined and caplog.records == []


def test_a_machine_whose_key_the_scheduler_lacks_says_so_and_joins_once_it_is_added(cluster_factory, tmp_path):
    import subprocess
    from cluster_harness import PY, ROOT, env
    c = cluster_factory(policy="gandiva", machines=())
    own = tmp_path / "m9-keys"
    keys.create(str(own), "daemon", "m9")
    shutil.copy(os.path.join(c.keys, "scheduler.pub"), own)
    log = tmp_path / "gmuxd-m9.log"
    with open(log, "ab") as out:
        d = subprocess.Popen([PY, "-m", "gmux.cli.gmuxd", "--runtime-dir", str(tmp_path / "rt-m9"), "--virtual-gpus",
                              "1x1GiB", "--scheduler", c.endpoint, "--keys", str(own), "--name", "m9",
                              "--warm-starts", "0"], env=env(), stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        wait_for(lambda: "refused this party's key (daemon.m9.pub" in log.read_text(), 30, lambda: log.read_text())
        assert c.ps()["machines"] == []
        shutil.copy(own / "daemon.m9.pub", c.keys)               # the operator adds it: no restart needed
        c.wait_machines(1, timeout=30)
        wait_for(lambda: f"the scheduler at {c.endpoint} accepted us: connected" in log.read_text(), 10,
                 lambda: log.read_text())
    finally:
        d.kill()
        d.wait()


def test_a_peer_that_goes_away_later_is_said_again_once_it_stays_away(world, caplog, monkeypatch):
    server_keys, client_keys, server, client = world
    monkeypatch.setattr(handshake_watch, "SILENCE_S", 1.0)
    caplog.set_level(logging.INFO, logger="gmux.handshake")
    shutil.copy(os.path.join(client_keys, "daemon.m1.pub"), server_keys)
    endpoint = server()
    w = client(endpoint)
    wait_for(lambda: _watch(w, 0.1) or w.joined, 10, "the handshake")
    assert caplog.records == []
    server.socket.close(0)                          # the scheduler goes away
    _watch(w, 2.0)
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and said[0].startswith(f"no answer from the scheduler at {endpoint} after 1 s"), said
