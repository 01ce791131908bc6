"""CurveZMQ key pairs for cluster mode: who may talk to gmux-scheduler and to a daemon's transfer endpoint.

A cluster's keys live in one directory (mode 0700), one pair per party, named by role and name:

    scheduler.pub / scheduler.secret
    daemon.NAME.pub / daemon.NAME.secret      one per machine's gmuxd
    client.NAME.pub / client.NAME.secret      one per user of `gmux submit --cluster`

Each file holds one z85 key (40 characters). On a real cluster each machine gets the public files and only its
own secret; on one machine (tests, a demo) they can share the directory. Authorising a party is having its
.pub file in the directory; revoking it is deleting that file (read again at every handshake, so no restart).

The scheduler accepts daemons and clients, and tells them apart by key (a client key cannot act as a daemon);
a daemon's transfer endpoint accepts the scheduler and other daemons. A peer with no key, or a key that is not
in the directory, never completes the CurveZMQ handshake: no message of it reaches our code.
"""
from __future__ import annotations

import inspect
import logging
import os
import threading
import time
from typing import Callable

import zmq
import zmq.utils.z85   # not imported by zmq itself: zmq.auth did that, and is imported only where needed

from gmux.util.atomic import write_atomic

log = logging.getLogger("gmux.keys")

ROLES = ("scheduler", "daemon", "client")
BULK_DOMAIN = "gmux-bulk"   # the ZAP domain of a bulk socket (gmux.wire.sealed), whose peers need no key
BULK_PEER_S = 600.0         # how long an address that passed a Curve handshake may connect to a bulk socket


class KeyError_(RuntimeError):
    """A key file that is missing or malformed; the text names it and says how to make one."""


def _check_name(name: str) -> str:
    if not name or len(name) > 64 or not all(c.isalnum() or c in "-_" for c in name):
        raise ValueError(f"key name {name!r}: use letters, digits, '-' and '_' (at most 64)")
    return name


def stem(role: str, name: str | None = None) -> str:
    if role not in ROLES:
        raise ValueError(f"role {role!r} is not one of {', '.join(ROLES)}")
    if role == "scheduler":
        return "scheduler"
    return f"{role}.{_check_name(name or '')}"


def _write(path: str, text: str, mode: int) -> None:
    write_atomic(path, text.encode() + b"\n", mode)


def create_all(keydir: str, pairs: list[tuple[str, str | None]], overwrite: bool = False) -> list[tuple[str, str]]:
    """Makes a key pair for each (role, name), or, if any name is bad, repeated or (without `overwrite`) taken,
    refuses them all before making any."""
    stems = [stem(role, name) for role, name in pairs]
    twice = sorted({s for s in stems if stems.count(s) > 1})
    if twice:
        raise ValueError(f"key {', '.join(twice)} asked for twice")
    _key_dir(keydir)
    if not overwrite:
        for s in stems:
            _refuse_taken(os.path.join(keydir, s))
    try:
        return [create(keydir, role, name, overwrite) for role, name in pairs]
    except OSError as e:
        raise KeyError_(f"cannot write keys in {keydir}: {e.strerror or e}") from None


def _key_dir(keydir: str) -> None:
    """Makes the key directory (mode 0700), or takes an existing one that only its owner can write: whoever can
    add a .pub file there is authorised. An existing directory's mode is not changed (it may be shared)."""
    try:
        if not os.path.isdir(keydir):
            os.makedirs(keydir, mode=0o700)
            os.chmod(keydir, 0o700)       # (makedirs' mode is reduced by the umask)
    except OSError as e:
        raise KeyError_(f"cannot make the key directory {keydir}: {e.strerror or e}") from None
    check_key_dir(keydir)


def check_key_dir(keydir: str) -> None:
    """A key directory that someone else could write to is refused: they could add a key of their own."""
    try:
        st = os.stat(keydir)
    except FileNotFoundError:
        raise KeyError_(f"no key directory {keydir}; create it with `gmux keys --dir {keydir} ...`") from None
    except OSError as e:
        raise KeyError_(f"key directory {keydir}: {e.strerror or e}") from None
    why = f"mode {oct(st.st_mode & 0o777)}" if st.st_mode & 0o022 else \
        f"owned by uid {st.st_uid}" if st.st_uid not in (os.getuid(), 0) else None
    if why:
        raise KeyError_(f"{keydir} can be written by others ({why}), who could add keys of their own and be let "
                        f"in: give the keys a directory of their own (gmux keys makes it, mode 0700) or chmod go-w it")


def _refuse_taken(base: str) -> None:
    if os.path.exists(base + ".pub") or os.path.exists(base + ".secret"):
        raise FileExistsError(f"{base}.pub already exists; delete it (revokes that key) or pass --force")


def create(keydir: str, role: str, name: str | None = None, overwrite: bool = False) -> tuple[str, str]:
    """Makes a key pair; returns (public file, secret file). Refuses to replace an existing pair silently."""
    _key_dir(keydir)
    base = os.path.join(keydir, stem(role, name))
    pub, sec = base + ".pub", base + ".secret"
    if not overwrite:
        _refuse_taken(base)
    public, secret = zmq.curve_keypair()
    _write(sec, secret.decode(), 0o600)
    _write(pub, public.decode(), 0o644)
    return pub, sec


def _read_key(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            key = f.read().strip()
    except FileNotFoundError:
        raise KeyError_(f"no key file {path}; create it with `gmux keys --dir {os.path.dirname(path)} ...`") from None
    if len(key) != 40:
        raise KeyError_(f"{path} does not hold a 40-character z85 CurveZMQ key")
    try:
        zmq.utils.z85.decode(key)
    except Exception:
        raise KeyError_(f"{path} is not z85 text") from None
    return key


def load_pair(keydir: str, role: str, name: str | None = None) -> tuple[bytes, bytes]:
    """(public, secret) of one party, z85 bytes, as setsockopt(CURVE_*KEY) takes them."""
    base = os.path.join(keydir, stem(role, name))
    secret_path = base + ".secret"
    if os.path.exists(secret_path) and os.stat(secret_path).st_mode & 0o077:
        raise KeyError_(f"{secret_path} is readable by others; chmod 600 it (a leaked secret key is a stolen "
                        f"identity)")
    return _read_key(base + ".pub"), _read_key(secret_path)


def load_public(keydir: str, role: str, name: str | None = None) -> bytes:
    return _read_key(os.path.join(keydir, stem(role, name) + ".pub"))


def authorized(keydir: str) -> dict[bytes, tuple[str, str]]:
    """Every public key in the directory: z85 key -> (role, name)."""
    out: dict[bytes, tuple[str, str]] = {}
    for fn in sorted(os.listdir(keydir)):
        if not fn.endswith(".pub"):
            continue
        parts = fn[:-4].split(".", 1)
        role, name = parts[0], (parts[1] if len(parts) > 1 else parts[0])
        if role not in ROLES:
            continue
        try:
            out[_read_key(os.path.join(keydir, fn))] = (role, name)
        except KeyError_ as e:     # a damaged .pub authorises nobody, and says so (read again only once changed)
            log.warning("key directory %s: %s: it authorises nobody", keydir, e)
    return out


class Guard:
    """A ZAP handler on `context` that admits CurveZMQ peers whose key is in `keydir` with one of `roles`.

    Runs pyzmq's authenticator thread; the key directory is re-read when it changes (mtime), so revoking a key
    takes effect at the next handshake. `who(key)` names an admitted peer for the service's own checks.

    A bulk socket's peers (gmux.wire.sealed, ZAP domain BULK_DOMAIN) have no key: a connection there is taken
    only from an address that passed a Curve handshake here in the last BULK_PEER_S (a sender connects to it
    right after its xfer_begin went over Curve), with a PLAIN login the host's receiver accepts
    (`bulk_login(transfer, password)`: gmux.wire.receiver.Receiver.bulk_login). A stranger who floods the port,
    elsewhere on the network or on a sender's own host, is refused at its handshake, before any frame of theirs
    costs the receiver's loop a decode."""

    def __init__(self, context: zmq.Context, keydir: str, roles: tuple):
        check_key_dir(keydir)
        self.keydir = keydir
        self.roles = roles
        self._lock = threading.Lock()
        self._mtime = None
        self._keys: dict[bytes, tuple[str, str]] = {}
        self._peers: dict[str, float] = {}      # address -> when it last passed a Curve handshake
        self._address = ""                      # of the handshake the authenticator thread is checking
        self.refused = 0
        self.refused_bulk = 0
        self.bulk_login: Callable[[str, bytes], bool] = lambda transfer, password: False
        self.auth = _authenticator(context, self)
        self.auth.start()
        self.auth.configure_curve_callback("*", credentials_provider=self)

    def _reload(self) -> dict:
        with self._lock:
            m = os.stat(self.keydir).st_mtime_ns
            if m != self._mtime:
                self._keys, self._mtime = authorized(self.keydir), m
            return self._keys

    def callback(self, domain: str, key: bytes) -> bool:   # called by the authenticator thread per handshake
        ok = self._reload().get(key, ("", ""))[0] in self.roles
        if not ok:
            self.refused += 1
        elif self._address:
            now = time.monotonic()
            if len(self._peers) > 4096:
                self._peers = {a: t for a, t in self._peers.items() if now - t < BULK_PEER_S}
            self._peers[self._address] = now
        return ok

    def bulk_peer(self, address: str, transfer: bytes, password: bytes) -> bool:
        """Whether a connection from `address`, logged in as `transfer` with `password`, may reach a bulk socket
        (see the class)."""
        ok = time.monotonic() - self._peers.get(address, -BULK_PEER_S * 2) < BULK_PEER_S and \
            self.bulk_login(transfer.decode("ascii", "replace"), password)
        if not ok:
            self.refused_bulk += 1
        return ok

    def who(self, key: bytes | str) -> tuple[str, str] | None:
        if isinstance(key, str):
            key = key.encode()
        return self._reload().get(key)

    def stop(self) -> None:
        self.auth.stop()


def _authenticator(context: zmq.Context, guard: Guard):
    """pyzmq's authenticator thread, which also tells the guard the address of each Curve handshake and asks it
    about each bulk socket's (whose PLAIN logins are transfers', not pyzmq's configured passwords)."""
    from zmq.auth.thread import ThreadAuthenticator   # here: it imports asyncio, which a CLI need not pay for
    asynchronous = inspect.iscoroutinefunction(ThreadAuthenticator.handle_zap_message)

    class Authenticator(ThreadAuthenticator):
        def handle_zap_message(self, msg):
            if len(msg) >= 6 and msg[2] == BULK_DOMAIN.encode():
                ok = len(msg) >= 8 and msg[5] == b"PLAIN" and guard.bulk_peer(msg[3].decode("ascii", "replace"),
                                                                             msg[6], msg[7])
                self._send_zap_reply(msg[1], b"200" if ok else b"400",
                                     b"OK" if ok else b"no open transfer's login from an address known here")
                return _nothing() if asynchronous else None
            guard._address = msg[3].decode("ascii", "replace") if len(msg) >= 6 and msg[5] == b"CURVE" else ""
            return super().handle_zap_message(msg)

    return Authenticator(context)


async def _nothing() -> None:
    return None


def server_socket(context: zmq.Context, kind: int, keydir: str, role: str, name: str | None = None) -> zmq.Socket:
    """A socket that is the CurveZMQ server side with this party's key pair (bind it afterwards)."""
    public, secret = load_pair(keydir, role, name)
    s = context.socket(kind)
    s.curve_secretkey = secret
    s.curve_publickey = public
    s.curve_server = True
    return s


def client_socket(context: zmq.Context, kind: int, keydir: str, role: str, name: str | None,
                  server_key: bytes) -> zmq.Socket:
    """A socket that is the CurveZMQ client side, authenticating as (role, name) to a server with `server_key`."""
    public, secret = load_pair(keydir, role, name)
    s = context.socket(kind)
    s.curve_secretkey = secret
    s.curve_publickey = public
    s.curve_serverkey = server_key
    return s
