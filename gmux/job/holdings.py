"""What a move's target already holds, so that its source need not send it (issue 15: incremental sends).

A move's new process builds its model before its checkpoint arrives. What training leaves alone, frozen
parameters (requires_grad False: a pretrained backbone under a fine-tuned head, frozen embeddings) and buffers
nothing updates, it then already holds byte for byte, if it builds them as the source did (from the same
pretrained file, or the same seed). The target offers the digests of those tensors (`Offer`, in a file beside
the checkpoint it waits for, which its link serves to the source: gmux.wire.transfer, xfer_holds). At its
checkpoint the source leaves out every tensor whose bytes have one of those digests: the stream's HEAD lists
it as held (row, digest) and the target takes those bytes from its own tensor (gmux.job.checkpoint).

What makes it safe: the digest is SHA-256 (over the SHA-256s of 16 MiB pieces, its first 16 bytes) of the
tensor's bytes as the source writes its checkpoint, so a tensor changed by any means is sent; and the target
looks the digest up among the tensors it hashed itself. A held tensor is the target's, identical in every
byte, or the restore is refused.

What it costs: the source hashes only tensors whose version counter has not moved since attach or the last
restore (`Unchanged`). An optimizer's step bumps it, so a model trained whole is sent without a hash, as before.
A tensor changed without bumping it (a native kernel's write, as batch norm writes its running statistics, or a
write through .data or numpy) is hashed, found different and sent: the counter decides only what is worth
hashing, never what is left out. The target hashes its frozen parameters and buffers while it waits for the
checkpoint, which is no downtime. Tensors under MIN_BYTES are always sent: their digest would save nothing.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterable, Optional

import torch

from gmux.protocol import HOLDS_DIGEST_BYTES, HOLDS_MAX, holds_problem
from gmux.util.atomic import atomic_open
from .checkpoint import host_bytes

MIN_BYTES = 64 << 10
PIECE_BYTES = 16 << 20


def _pieces(t: torch.Tensor) -> list:
    """A tensor's bytes in pieces of about PIECE_BYTES, each hashed on its own (a large tensor's on several
    cores; a device tensor's copied to the host a piece at a time)."""
    flat = t.detach().reshape(-1)
    step = max(1, PIECE_BYTES // max(1, t.element_size()))
    return [flat[lo:lo + step] for lo in range(0, max(1, flat.numel()), step)]


def _sha(piece: torch.Tensor) -> bytes:
    return hashlib.sha256(host_bytes(piece)).digest()   # (hashlib releases the GIL)


def digests(tensors: list) -> list:
    """Each tensor's digest: SHA-256 over the SHA-256s of its pieces, its first HOLDS_DIGEST_BYTES; every piece
    of every tensor hashed in parallel over the machine's cores."""
    pieces = [_pieces(t) for t in tensors]
    work = [p for ps in pieces for p in ps]
    with ThreadPoolExecutor(max(1, min(len(work), os.cpu_count() or 1, 16)), thread_name_prefix="digest") as pool:
        shas = iter(list(pool.map(_sha, work)))
    return [hashlib.sha256(b"".join(next(shas) for _ in ps)).digest()[:HOLDS_DIGEST_BYTES] for ps in pieces]


def digest(t: torch.Tensor) -> bytes:
    return digests([t])[0]


def holds_path(checkpoint_path: str) -> str:
    """Where a move's new process offers what it holds: beside the checkpoint it waits for."""
    return checkpoint_path.removesuffix(".ckpt") + ".holds"


def parse(wire: bytes) -> frozenset:
    """Digests offered over the wire (concatenated, HOLDS_DIGEST_BYTES each); anything malformed offers none."""
    if holds_problem(wire):
        return frozenset()
    return frozenset(wire[i:i + HOLDS_DIGEST_BYTES] for i in range(0, len(wire), HOLDS_DIGEST_BYTES))


def _settled(modules: Iterable) -> list:
    """Tensors of these modules that training leaves alone: frozen parameters and buffers, each once."""
    seen, out = set(), []
    for m in modules:
        for t in [p for p in m.parameters() if not p.requires_grad] + list(m.buffers()):
            if id(t) not in seen and t.numel() * t.element_size() >= MIN_BYTES:
                seen.add(id(t))
                out.append(t)
    return out


class Offer:
    """The target's side: its settled tensors by digest."""

    def __init__(self, by_digest: dict):
        self.by_digest = by_digest

    @classmethod
    def of(cls, modules: Iterable) -> "Offer":
        tensors = sorted(_settled(modules), key=lambda t: -t.numel() * t.element_size())[:HOLDS_MAX]
        return cls(dict(zip(digests(tensors), tensors)))

    def wire(self) -> bytes:
        return b"".join(self.by_digest)

    def find(self, d: bytes) -> Optional[torch.Tensor]:
        return self.by_digest.get(d)

    def save(self, path: str) -> bool:
        """Writes the offer where the link serves it from (atomically: the link never serves half of one);
        False if it cannot (a directory this process may not write: then the whole checkpoint comes)."""
        if not self.by_digest:
            return False
        try:
            with atomic_open(path, durable=False) as f:    # (gone with the process if it crashes: no fsync)
                f.write(self.wire())
            return True
        except OSError:
            return False

    @staticmethod
    def withdraw(path: str) -> None:
        with contextlib.suppress(OSError):
            os.unlink(path)


def _key(t: torch.Tensor) -> tuple:
    """What a tensor is a view of: equal for a parameter and the state dict's entry for it, and unchanged by a
    suspend that empties its storage."""
    return t.untyped_storage()._cdata, t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype


class Unchanged:
    """The source's side: which of a job's module tensors have not moved (version counter) since `mark`."""

    def __init__(self, modules: list):
        self.modules = modules
        self._marks: list = []
        self.mark()

    def mark(self) -> None:
        self._marks = [(weakref.ref(t), t._version) for m in self.modules
                       for t in list(m.parameters()) + list(m.buffers())
                       if not t.is_inference() and t.layout == torch.strided]
        # (one made under inference_mode has no version counter; a sparse one no storage: its parts are new views)

    def keys(self) -> set:
        return {_key(t) for t, v in ((ref(), v) for ref, v in self._marks) if t is not None and t._version == v}

    def held(self, holds: frozenset, resolve: Callable[[torch.Tensor], torch.Tensor]) \
            -> Callable[[list], dict]:
        """For checkpoint.write: of the tensors it writes, the rows the target holds ({row: digest}).
        `resolve` maps a live tensor to where its values are (a suspended one's host copy)."""
        def rows(tensors: list) -> dict:
            if not holds:
                return {}
            unchanged = self.keys()
            candidates = [i for i, t in enumerate(tensors)
                          if t.numel() * t.element_size() >= MIN_BYTES and _key(t) in unchanged]
            found = digests([resolve(tensors[i]) for i in candidates])
            return {i: d for i, d in zip(candidates, found) if d in holds}
        return rows
