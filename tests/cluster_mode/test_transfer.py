"""Checkpoint transfer over CurveZMQ: bit-exact, resumable after a dropped TCP connection, refuses strangers."""
import os
import threading

import pytest
import zmq

from gmux import protocol
from gmux.wire import keys
from gmux.wire.transfer import CHUNK, WINDOW, Receiver, TransferError, send_file
from proxy_util import Proxy


def _serve(keydir, directory, stop):
    """A receiver on a Curve ROUTER, as a daemon's cluster link hosts it."""
    ctx = zmq.Context()
    guard = keys.Guard(ctx, keydir, ("scheduler", "daemon"))
    sock = keys.server_socket(ctx, zmq.ROUTER, keydir, "daemon", "b")
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    recv = Receiver(directory)
    state = {"port": port, "recv": recv, "guard": guard}

    def loop():
        while not stop.is_set():
            if not sock.poll(50):
                continue
            ident, *frames = sock.recv_multipart()
            try:
                msg = protocol.decode(frames[0], protocol.CLUSTER_MESSAGES)
                ok, out = recv.handle(msg, frames[1] if len(frames) > 1 else None)
            except protocol.ProtocolError as e:
                ok, out, msg = False, str(e), None
            mid = msg.id if msg else 0
            sock.send_multipart([ident, protocol.reply(mid, True, data=out) if ok else protocol.error_reply(mid, out)])
        sock.close(0)
        guard.stop()
        ctx.term()
    t = threading.Thread(target=loop, daemon=True)
    t.start()
    return state, t


@pytest.fixture
def keydir(tmp_path):
    """Made with the CLI, as a user would: gmux keys."""
    import subprocess
    import sys
    from cluster_harness import ROOT, env
    d = str(tmp_path / "keys")
    r = subprocess.run([sys.executable, "-m", "gmux.cli.gmux", "keys", "--dir", d, "--scheduler", "--daemon", "a",
                        "--daemon", "b"], env=env(), capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert r.returncode == 0, r.stderr
    assert oct(os.stat(d).st_mode & 0o777) == "0o700"
    assert all(os.stat(os.path.join(d, f)).st_mode & 0o077 == 0 for f in os.listdir(d) if f.endswith(".secret"))
    assert sorted(keys.authorized(d).values()) == [("daemon", "a"), ("daemon", "b"), ("scheduler", "scheduler")]
    return d


def test_transfer_exact_and_resumes_after_cut(keydir, tmp_path):
    src = tmp_path / "src.ckpt"
    payload = os.urandom(48 << 20) + b"tail"
    src.write_bytes(payload)
    stop = threading.Event()
    st, t = _serve(keydir, str(tmp_path / "in"), stop)
    try:
        server_key = keys.load_public(keydir, "daemon", "b")
        proxy = Proxy(st["port"], cut_after=20 << 20)
        r = send_file(str(src), f"tcp://127.0.0.1:{proxy.port}", server_key, keydir, "daemon", "a", "c1-1",
                      timeout=1.5)
        # The cut loses what was on the wire; zmq reconnects by itself (then the receiver's "have" rewinds the
        # sender) or the sender's timeout opens a new connection: either way it resumes where the receiver is.
        assert proxy.cuts == 1 and r["reconnects"] + r["rewinds"] >= 1
        assert open(r["path"], "rb").read() == payload
        # Resumed, not restarted: at most the window in flight at the cut is sent twice.
        assert r["resent"] <= WINDOW * CHUNK
        assert r["resent"] < len(payload) / 2
        proxy.close()
    finally:
        stop.set()
        t.join(5)


def test_stranger_and_wrong_key_refused(keydir, tmp_path):
    src = tmp_path / "s.ckpt"
    src.write_bytes(b"x" * 1000)
    stop = threading.Event()
    st, t = _serve(keydir, str(tmp_path / "in"), stop)
    try:
        other = str(tmp_path / "otherkeys")
        keys.create(other, "daemon", "a")      # same name, a key the cluster never authorised
        with pytest.raises(TransferError, match="no answer"):
            send_file(str(src), f"tcp://127.0.0.1:{st['port']}", keys.load_public(keydir, "daemon", "b"),
                      other, "daemon", "a", "c9-1", timeout=0.5, attempts=2)
        assert st["guard"].refused >= 1
        ctx = zmq.Context.instance()
        plain = ctx.socket(zmq.DEALER)          # no CurveZMQ at all
        plain.setsockopt(zmq.LINGER, 0)
        # A DEALER's send blocks until a peer is ready, and a plain peer of a Curve server may never be: the
        # handshake fails (refused, what this checks) before any message can be queued.
        plain.setsockopt(zmq.SNDTIMEO, 1000)
        plain.connect(f"tcp://127.0.0.1:{st['port']}")
        try:
            plain.send(protocol.encode("xfer_begin", 1, table=protocol.CLUSTER_MESSAGES, xfer="c9-2", size=5))
        except zmq.Again:
            pass
        assert not plain.poll(700)
        plain.close(0)
        assert not os.listdir(str(tmp_path / "in"))
    finally:
        stop.set()
        t.join(5)


def test_an_abandoned_partial_file_is_deleted_and_a_late_sender_starts_again(tmp_path):
    import time
    import zlib
    from gmux.wire.transfer import STALE_S
    recv = Receiver(str(tmp_path / "in"))
    chunk = os.urandom(CHUNK)

    def msg(mtype, **fields):
        return protocol.decode(protocol.encode(mtype, 1, protocol.CLUSTER_MESSAGES, **fields), protocol.CLUSTER_MESSAGES)
    assert recv.handle(msg("xfer_begin", xfer="a-j1.0", size=3 * CHUNK), None) == (True, {"have": 0})
    assert recv.handle(msg("xfer_chunk", xfer="a-j1.0", offset=0, crc=zlib.crc32(chunk)), chunk)[1] == {"have": CHUNK}
    # A partial file left by an earlier receiver process, as old as the stale limit.
    orphan = tmp_path / "in" / "a-j2.0.part"
    orphan.write_bytes(chunk)
    os.utime(orphan, (time.time() - STALE_S - 1,) * 2)
    part = tmp_path / "in" / "a-j1.0.part"
    assert recv.expire() == 1 and part.exists() and not orphan.exists()   # the open one is still fed
    assert recv.expire(time.time() + 10) == 0                             # looked at most every 30 s
    assert recv.expire(time.time() + STALE_S + 60) == 1 and not part.exists() and recv.expired == 2
    r = recv.handle(msg("xfer_chunk", xfer="a-j1.0", offset=CHUNK, crc=zlib.crc32(chunk)), chunk)
    assert not r[0] and "xfer_begin" in r[1]
    assert recv.handle(msg("xfer_begin", xfer="a-j1.0", size=3 * CHUNK), None) == (True, {"have": 0})
