"""Checkpoint transfer over CurveZMQ: bit-exact, resumable after a dropped TCP connection, refuses strangers;
streams from a job's pipe likewise, completed only once the job has vouched for what it wrote."""
import io
import os
import threading
import time

import pytest
import zmq

from gmux import protocol
from gmux.wire import keys, sealed
from gmux.wire.receiver import Receiver
from gmux.wire.transfer import CHUNK, WINDOW, TransferError, send_file
from proxy_util import Proxy


def _serve(keydir, directory, stop, bulk=False, durable=True):
    """A receiver on a Curve ROUTER, as a daemon's cluster link hosts it; `bulk`: with its plain bulk socket
    beside it (state["bulk"]: its port; a test may point the receiver's offer elsewhere, at a proxy);
    `durable=False`: a move's target's."""
    ctx = zmq.Context()
    guard = keys.Guard(ctx, keydir, ("scheduler", "daemon"))
    sock = keys.server_socket(ctx, zmq.ROUTER, keydir, "daemon", "b")
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    plain, bulk_port = sealed.bulk_socket(ctx, f"tcp://127.0.0.1:{port}")   # as a link or the scheduler makes it
    recv = Receiver(directory, durable=durable, bulk_port=bulk_port if bulk else None)
    guard.bulk_login = recv.bulk_login
    state = {"port": port, "recv": recv, "guard": guard, "bulk": bulk_port}

    def loop():
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        poller.register(plain, zmq.POLLIN)
        while not stop.is_set():
            ready = dict(poller.poll(50))
            if plain in ready:
                sealed.serve_bulk(plain, recv.handle_sealed)
            if sock not in ready:
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
        plain.close(0)
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


def test_a_damaged_public_key_authorises_nobody_and_says_so(keydir, caplog):
    """A malformed .pub in the key directory was skipped without a word: its owner could not tell why their
    machine was refused."""
    with open(os.path.join(keydir, "daemon.c.pub"), "w") as f:
        f.write("not a key\n")
    with caplog.at_level("WARNING", logger="gmux.keys"):
        found = keys.authorized(keydir)
    assert ("daemon", "c") not in found.values() and ("daemon", "a") in found.values()
    assert "daemon.c.pub does not hold a 40-character z85 CurveZMQ key: it authorises nobody" in caplog.text


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


def msg(mtype, **fields):
    return protocol.decode(protocol.encode(mtype, 1, protocol.CLUSTER_MESSAGES, **fields), protocol.CLUSTER_MESSAGES)


def _one_chunk_in(tmp_path):
    """A receiver holding the first of the three chunks of transfer a-j1.0; (the receiver, a chunk)."""
    recv = Receiver(str(tmp_path / "in"))
    chunk = os.urandom(CHUNK)
    assert recv.handle(msg("xfer_begin", xfer="a-j1.0", size=3 * CHUNK), None) == (True, {"have": 0})
    assert recv.handle(msg("xfer_chunk", xfer="a-j1.0", offset=0), chunk)[1] == {"have": CHUNK}
    return recv, chunk


def test_an_abandoned_partial_file_is_deleted_and_a_late_sender_starts_again(tmp_path):
    import time
    from gmux.wire.receiver import STALE_S
    recv, chunk = _one_chunk_in(tmp_path)
    # A partial file left by an earlier receiver process, as old as the stale limit.
    orphan = tmp_path / "in" / "a-j2.0.part"
    orphan.write_bytes(chunk)
    os.utime(orphan, (time.time() - STALE_S - 1,) * 2)
    part = tmp_path / "in" / "a-j1.0.part"
    assert recv.expire() == 1 and part.exists() and not orphan.exists()   # the open one is still fed
    assert recv.expire(time.time() + 10) == 0                             # looked at most every 30 s
    assert recv.expire(time.time() + STALE_S + 60) == 1 and not part.exists() and recv.expired == 2
    r = recv.handle(msg("xfer_chunk", xfer="a-j1.0", offset=CHUNK), chunk)
    assert not r[0] and "xfer_begin" in r[1]
    assert recv.handle(msg("xfer_begin", xfer="a-j1.0", size=3 * CHUNK), None) == (True, {"have": 0})


# -- streams: a checkpoint sent as the job writes it, never staged in a file (gmux.node.cluster_stream) --------
def _writer(payload: bytes, bound: int):
    """A pipe fed by a thread as a job feeds it: the size's bound first, then the bytes; (read end, thread)."""
    import struct
    r, w = os.pipe()

    def feed():
        with open(w, "wb") as f:
            f.write(struct.pack("<Q", bound))
            for lo in range(0, len(payload), 1 << 20):
                f.write(payload[lo:lo + (1 << 20)])
    t = threading.Thread(target=feed, daemon=True)
    t.start()
    return open(r, "rb", buffering=CHUNK), t


def test_a_stream_is_exact_and_resumes_after_a_cut_from_what_it_kept(keydir, tmp_path):
    from gmux.wire.transfer import send_stream
    payload = os.urandom(40 << 20) + b"tail"
    stop = threading.Event()
    st, t = _serve(keydir, str(tmp_path / "in"), stop)
    try:
        server_key = keys.load_public(keydir, "daemon", "b")
        proxy = Proxy(st["port"], cut_after=16 << 20)
        pipe, feeder = _writer(payload, len(payload) + 3)          # a bound, as a checkpoint announces it
        r = send_stream(pipe.read, f"tcp://127.0.0.1:{proxy.port}", server_key, keydir, "daemon", "a", "c1-2",
                        timeout=1.5)
        feeder.join()
        assert proxy.cuts == 1 and r["reconnects"] + r["rewinds"] >= 1
        assert open(r["path"], "rb").read() == payload and r["bytes"] == len(payload)
        # (each reconnection resends at most the window; on a loaded machine a slow answer is one more)
        assert r["resent"] <= max(1, r["reconnects"] + r["rewinds"]) * WINDOW * CHUNK, r
        proxy.close()
    finally:
        stop.set()
        t.join(5)


def _job_checkpoint(tmp_path):
    import torch
    from torch import nn

    import gmux.job as gj
    torch.manual_seed(0)
    # 6 MB: more than the pipe holds (1 MiB), so a writer whose reader gave up sees it
    model = nn.Sequential(nn.Linear(64, 4096), nn.ReLU(), nn.Linear(4096, 64))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(4, 64)).sum().backward()
    opt.step()
    job = gj.attach(model, opt)
    job.suspend()                                           # as in a move: from the suspended host copy
    return job


def test_a_job_streams_its_checkpoint_through_a_pipe_and_it_lands_verified(keydir, tmp_path):
    import torch

    from gmux.job import checkpoint as ckpt
    from gmux.node.cluster_stream import stream_out
    from gmux.wire.transfer import send_stream
    job = _job_checkpoint(tmp_path)
    stop = threading.Event()
    st, t = _serve(keydir, str(tmp_path / "in"), stop)
    endpoint, server_key = f"tcp://127.0.0.1:{st['port']}", keys.load_public(keydir, "daemon", "b")
    send = lambda read, **kw: send_stream(read, endpoint, server_key, keydir, "daemon", "a", "c2-1", **kw)
    path = str(tmp_path / "c2.snapshot.ckpt")
    try:
        r = stream_out(path, lambda: job.checkpoint(path) and None, send)
        assert not os.path.exists(path)                      # the pipe is gone; nothing was staged
        staged = io.BytesIO()
        job.checkpoint(staged)
        assert open(r["path"], "rb").read() == staged.getvalue()   # byte for byte the checkpoint, verified
        snap = ckpt.load(r["path"])
        assert torch.equal(snap["modules"][0]["0.weight"], job.tier.host_view(job.tracked.modules[0][0].weight))

        # A job whose checkpoint is refused before it opens the pipe: nothing lands, the error is told.
        with pytest.raises(RuntimeError, match="busy"):
            stream_out(path, lambda: "busy with a suspend", send)

        # A job that writes half its checkpoint and fails: the stream just stops, and is never completed.
        def half() -> str:
            fd = os.open(path, os.O_WRONLY)
            os.write(fd, (10 << 20).to_bytes(8, "little") + os.urandom(3 << 20))
            os.close(fd)
            return "RuntimeError: the job failed half-way"
        with pytest.raises(RuntimeError, match="half-way"):
            stream_out(path, half, lambda read, **kw: send_stream(read, endpoint, server_key, keydir, "daemon", "a",
                                                                 "c3-1", **kw))
        assert not os.path.exists(os.path.join(str(tmp_path / "in"), "c3-1.ckpt"))
        assert os.path.exists(os.path.join(str(tmp_path / "in"), "c2-1.ckpt"))
    finally:
        stop.set()
        t.join(5)


def test_a_transfer_that_fails_fails_the_jobs_checkpoint_which_stays_suspended(keydir, tmp_path):
    from gmux.node.cluster_stream import stream_out
    from gmux.wire.transfer import send_stream
    job = _job_checkpoint(tmp_path)
    path = str(tmp_path / "c4.snapshot.ckpt")
    nobody = "tcp://127.0.0.1:9"                              # no receiver: the sender gives up
    send = lambda read, **kw: send_stream(read, nobody, keys.load_public(keydir, "daemon", "b"), keydir, "daemon",
                                          "a", "c4-1", timeout=0.3, attempts=1, **kw)
    errors = []

    def checkpoint():
        try:
            job.checkpoint(path)
        except OSError as e:                                 # the pipe's reader gave up: EPIPE
            errors.append(e)
            return f"checkpoint failed: {e}"
    with pytest.raises(TransferError, match="no answer"):
        stream_out(path, checkpoint, send)
    assert errors and isinstance(errors[0], BrokenPipeError)
    assert job.suspended
    job.resume()


def test_a_checkpoint_is_asked_again_while_gmuxd_is_busy_with_the_moves_suspend():
    from gmux.node.cluster_stream import patiently
    from gmux.wire.daemon_client import GmuxBusy, GmuxError
    answers = iter([GmuxBusy("checkpoint: j1 is busy with a suspend; try again in a moment")] * 2 + [None])
    assert patiently(lambda: next(answers)) is None                 # a job stopped at its deadline got there
    assert patiently(lambda: GmuxError("checkpoint: j1 has not started")) == "checkpoint: j1 has not started"
    # only the reply's busy flag counts, not the wording: a refusal that merely says "busy" is final
    assert patiently(lambda: GmuxError("checkpoint: j1 is busy with a suspend")) == "checkpoint: j1 is busy with a suspend"
    t0 = time.monotonic()
    assert "busy" in patiently(lambda: GmuxBusy("checkpoint: j1 is busy with a suspend"), patience=0.3)
    assert time.monotonic() - t0 >= 0.3


def test_a_pipe_left_by_a_killed_link_does_not_block_a_staged_checkpoint(tmp_path):
    from gmux.node.cluster_stream import staged
    path = str(tmp_path / "j1.snapshot.ckpt")
    os.mkfifo(path)

    def job_writes_a_file():
        assert not os.path.exists(path)          # gone before the job was asked
        open(path, "wb").write(b"checkpoint")
    assert staged(path, lambda: job_writes_a_file()) is None
    assert open(path, "rb").read() == b"checkpoint"


def test_a_full_disk_gives_the_transfer_up_and_leaves_nothing_behind(tmp_path, monkeypatch):
    # The receiver cannot store a chunk (ENOSPC, after a short write): the sender hears why, the partial file is
    # deleted (it would only hold the space), and a later transfer of the same name starts afresh.
    import errno
    from gmux.wire import receiver
    recv, chunk = _one_chunk_in(tmp_path)
    real_write, calls = os.write, []

    def full(fd, data):
        calls.append(len(data))
        if len(calls) == 1:
            return real_write(fd, bytes(data[:100]))      # what still fitted
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(receiver.os, "write", full)
    ok, why = recv.handle(msg("xfer_chunk", xfer="a-j1.0", offset=CHUNK), chunk)
    assert not ok and "cannot store it on this machine: No space left on device" in why, why
    assert calls == [CHUNK, CHUNK - 100]
    assert os.listdir(tmp_path / "in") == [] and recv.open == {}
    monkeypatch.setattr(receiver.os, "write", real_write)
    assert recv.handle(msg("xfer_begin", xfer="a-j1.0", size=CHUNK), None) == (True, {"have": 0})
    assert recv.handle(msg("xfer_chunk", xfer="a-j1.0", offset=0), chunk)[1] == {"have": CHUNK}
    assert recv.handle(msg("xfer_end", xfer="a-j1.0"), None)[0]
    assert (tmp_path / "in" / "a-j1.0.ckpt").read_bytes() == chunk


def test_a_planted_symlink_or_pipe_is_not_sent(keydir, tmp_path):
    # A system daemon's link sends a checkpoint from its user's directory: a user who makes it a link to a file
    # only root may read (or a pipe that never ends) gets a refusal, and nothing leaves the machine.
    secret = tmp_path / "root-only"
    secret.write_bytes(b"s" * 1000)
    link, pipe = tmp_path / "link.ckpt", tmp_path / "pipe.ckpt"
    os.symlink(secret, link)
    os.mkfifo(pipe)
    stop = threading.Event()
    st, t = _serve(keydir, str(tmp_path / "in"), stop)
    try:
        for path, match in ((link, "Too many levels of symbolic links|ELOOP|symbolic"), (pipe, "not a regular")):
            with pytest.raises((TransferError, OSError), match=match):
                send_file(str(path), f"tcp://127.0.0.1:{st['port']}", keys.load_public(keydir, "daemon", "b"),
                          keydir, "daemon", "a", "c9-2", timeout=0.5, attempts=1)
        assert os.listdir(tmp_path / "in") == []
    finally:
        stop.set()
        t.join()
