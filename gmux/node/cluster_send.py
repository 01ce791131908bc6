"""A move's source side, on a worker thread of the machine's cluster link (gmux.node.cluster_link): the job
suspended at one boundary (every rank at once) and its checkpoints streamed to the target as they are written
(gmux.node.cluster_stream). Its outcome goes up as "migrate_sent", or "migrate_failed" with the job resumed here.
The scheduler may give the send up ("abandon": its target failed, or restarted its gmuxd): `stop` is set, and
the send ends within moments instead of once its sender has waited out every silence of a dead endpoint.
"""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from gmux.wire import keys
from gmux.wire.daemon_client import GmuxError
from gmux.wire.transfer import ask_holds, rank_xfers
from gmux.node.cluster_records import running_before_boundary, taken_at
from gmux.node.cluster_stream import stream_ranks

if TYPE_CHECKING:
    from gmux.node.cluster_link import ClusterLink


def migrate_out(link: "ClusterLink", cjob: str, ranks: list, target: str, endpoint: str, xfer: str,
                stop: threading.Event, resume: bool = True) -> None:
    """resume: whether a failed move leaves the job running here (false: the scheduler had suspended it)."""
    try:
        target_key = keys.load_public(link.keydir, "daemon", target)
        # What the new processes hold already (their frozen tensors), asked while the job still computes.
        holds = dict(zip(ranks, each(lambda name: ask_holds(endpoint, target_key, xfer=name, **link._sender()),
                                     rank_xfers(xfer, len(ranks)))))
        t0 = time.perf_counter()
        with link._gang_lock(cjob):
            # (to_boundary: stopped at its deadline, a job would reach the boundary this move needs only
            # when resumed; in_place: the checkpoint is written from live memory, and a failed move resumes
            # the job with nothing to copy back)
            replies = each(lambda local: link._admin_reply("suspend", local, to_boundary=True, in_place=True,
                                                           for_move=True), ranks)
            errors = [str(e) for e, _ in replies if e]
            if errors:                                 # at its next boundary (every rank at one); held there
                raise GmuxError(errors[0] if errors[0].startswith("suspend") else f"suspend: {errors[0]}")
            t_susp = time.perf_counter() - t0
            running = running_before_boundary(t_susp, [r for _, r in replies])
            if stop.is_set():
                raise GmuxError("the move was given up while the job suspended")
            # streamed from live memory (cluster_stream), all ranks at once
            steps: dict = {}
            xfers, r = stream_ranks(ranks, endpoint, target_key, xfer, link._snapshot_path,
                                    link._checkpointer(steps, holds), link._sender(), stop)
            step, t_ckpt = taken_at(steps, ranks), r["checkpoint_s"]
    except Exception as e:
        for local in ranks if resume else ():
            link._admin_reply("resume", local)         # the move failed: the job runs on here
        link._event("migrate_failed", cjob, f"{type(e).__name__}: {e}")
        return
    finally:
        if link.sending.get(cjob) is stop:
            del link.sending[cjob]
    link._event("migrate_sent", cjob, xfers=xfers, bytes=r["bytes"], sealed_bytes=r["sealed_bytes"],
                seconds=time.perf_counter() - t0,
                suspend_s=t_susp, checkpoint_s=t_ckpt, transfer_s=r["seconds"], step=step,
                **({"running_s": running} if running is not None else {}))


def each(fn, items: list) -> list:
    """fn(item) for every item at the same time; their results in order."""
    if len(items) == 1:
        return [fn(items[0])]
    with ThreadPoolExecutor(len(items), thread_name_prefix="rank") as ex:
        return list(ex.map(fn, items))
