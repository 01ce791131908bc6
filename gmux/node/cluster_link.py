"""The gmuxd side of cluster mode: reports this machine to gmux-scheduler and carries out its actions.

Runs beside the daemon (a thread of `gmuxd --scheduler ADDR`, or `python -m gmux.cli.cluster_link`), and
talks to its gmuxd only through the admin socket, like the CLI: the daemon's single-threaded loop is never
entered from another thread. Toward the cluster it holds:
  - a DEALER to the scheduler (CurveZMQ client with this machine's daemon key; routing id NAME/BOOT), on which
    it sends a full report every REPORT_S and events, and receives node_actions;
  - a ROUTER (CurveZMQ server, same key) where checkpoints arrive from other daemons and from the scheduler;
  - a plain ROUTER beside it (the bulk socket) where a transfer's chunks arrive sealed with the key its sender
    agreed over Curve (gmux.wire.sealed), a third of Curve's time per byte.
Cluster jobs run under `gmux-launch --no-hook --name CJOB` (explicit mode: the script attaches and restores
itself, so it can continue in another process on another machine). A gang (a job of n ranks, one per GPU)
runs n of them, named CJOB.RANK, that meet at a rendezvous on loopback the link picks afresh at every start;
the link reports them as one job (with its ranks) and acts on all of them at once: the ranks' GangController
makes them carry out a suspend or a checkpoint at one step, but only when every rank has been asked, so the
requests go out together. Slow work (waiting for a job's boundary, streaming a checkpoint, starting
processes) runs on worker threads; only this loop touches its sockets.

Starts, until the job is past its first boundary here, are gmux.node.cluster_starts'; a move's checkpoint
leaves through gmux.node.cluster_send; what it asks gmuxd goes through gmux.node.cluster_gmuxd.
"""
from __future__ import annotations

import contextlib
import logging
import os
import queue
import secrets
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Optional

import zmq

from gmux import protocol
from gmux.wire import keys, sealed
from gmux.wire.receiver import Receiver
from gmux.wire.daemon_client import GmuxError
from gmux.wire.handshake_watch import HandshakeWatch
from gmux.wire.server import Server, configure
from gmux.node.checkpoint_clock import CheckpointClock
from gmux.node.cluster_fence import Fence
from gmux.node.cluster_gmuxd import LocalGmuxd
from gmux.node.cluster_records import busy_data, gang_record, kill_reason, ranks_by_job, taken_at
from gmux.node.cluster_starts import Starts
from gmux.node.cluster_send import each, migrate_out
from gmux.node.cluster_stream import send_files, staged
from gmux.node.warm_pool import WarmPool
from gmux.rundir import RuntimeDir, RuntimeDirError
from gmux.util.wakeup import Wakeup

log = logging.getLogger("gmux.cluster_link")
C = protocol.CLUSTER_MESSAGES
REPORT_S = 0.5
IDLE_POLL_MS = 100
# While a job starts here the link looks at gmuxd's live jobs this often: a move's source computes on until we
# say the new processes wait for their checkpoints, and holds the job until we say it is past a boundary, so
# each look's delay is the move's (a look costs gmuxd a listing of its live jobs, about a millisecond).
STARTING_LOOK_S = 0.02
LINK_PS_LIMIT = 1000    # the link reads every live job and the newest ended ones (gmuxd keeps 1000 ended)


class ClusterLink:
    def __init__(self, runtime_dir: str, name: str, scheduler: str, keydir: str, listen: str = "tcp://127.0.0.1:0",
                 warm_starts: int = 1):
        self.rundir = RuntimeDir(runtime_dir)
        self.gmuxd = LocalGmuxd(self.rundir.root)
        if self.rundir.system:
            # (the link would start users' jobs and read their checkpoints as root; docs/security.md)
            raise RuntimeDirError(f"{runtime_dir} is a system daemon's: cluster mode is not supported there yet; "
                                  f"run a per-user gmuxd in cluster mode")
        self.name = name
        self.keydir = keydir
        self.scheduler_endpoint = scheduler
        self.ctx = zmq.Context()        # its own context: the ZAP handler must not see gmuxd's ipc socket
        self.guard = keys.Guard(self.ctx, keydir, ("scheduler", "daemon"))
        self.inbox = configure(keys.server_socket(self.ctx, zmq.ROUTER, keydir, "daemon", name))
        self.inbox.setsockopt(zmq.MAXMSGSIZE, protocol.XFER_MAX_CHUNK + protocol.MAX_FRAME)
        self.inbox.bind(listen)
        # Checkpoints arriving from other machines and the scheduler: the shared loop's, polled beside our DEALER.
        xfers = ("xfer_begin", "xfer_chunk", "xfer_end", "xfer_holds")
        self.transfers = Server(self.inbox, {t: self._xfer for t in xfers},
                                name="cluster link", table=C, refusals=(protocol.ProtocolError,), attachments=True,
                                unknown="{type} is not accepted on a transfer endpoint")
        self.transfer_endpoint = self.inbox.getsockopt_string(zmq.LAST_ENDPOINT)
        self.bulk, bulk_port = sealed.bulk_socket(self.ctx, self.transfer_endpoint)
        # (private, as gmuxd makes it: made first with the default mode, gmuxd refused it as open to others)
        self.rundir.create()
        # No fsync: a move's source holds the job until the target restored, the scheduler its own checkpoints.
        self.receiver = Receiver(os.path.join(self.rundir.root, "cluster-in"), durable=False, bulk_port=bulk_port)
        self.guard.bulk_login = self.receiver.bulk_login
        self.up = keys.client_socket(self.ctx, zmq.DEALER, keydir, "daemon", name,
                                     keys.load_public(keydir, "scheduler"))
        # (NAME/BOOT: the scheduler tells this gmuxd from another given the same name, or a restarted one)
        self.up.setsockopt(zmq.IDENTITY, f"{name}/{secrets.token_hex(4)}".encode())
        self.up.setsockopt(zmq.LINGER, 0)
        self.up.setsockopt(zmq.SNDHWM, 100)
        self.up.setsockopt(zmq.RECONNECT_IVL_MAX, 1000)
        self.handshake = HandshakeWatch(self.up, scheduler, "scheduler", f"daemon.{name}", "scheduler")
        self.up.connect(scheduler)
        self.pool = ThreadPoolExecutor(4, thread_name_prefix="cluster-link")
        self.outbox: "queue.SimpleQueue" = queue.SimpleQueue()   # (event, cjob, detail, data) from workers
        # A byte written here wakes the loop for an event a worker queued: a move's "migrate_sent" and a gang's
        # "action_failed" go up at once, not at the loop's next look (up to IDLE_POLL_MS later).
        self.wakeup = Wakeup()
        self.warm = WarmPool(self.rundir.root, self.rundir.logs(), warm_starts)
        self.warm.fill()
        self.starts = Starts(self.rundir, self._event, self.warm, self.receiver.reader_gone)
        self.busy: set[str] = set()            # cjobs with a worker on them (no periodic checkpoint meanwhile)
        self.sending: dict[str, threading.Event] = {}   # cjob -> its move's send under way here: set, given up
        self.world: dict[str, int] = {}        # cjob -> its number of ranks
        self.locals: dict[str, list] = {}      # cjob -> each rank's job id on this gmuxd, latest report
        self.broken: set[str] = set()          # gangs with a rank ended badly, whose other ranks were killed
        self.clock = CheckpointClock()         # periodic checkpoints to the scheduler
        # One gang-wide request at a time per job: a move makes the ranks' snapshot paths its streams' pipes, and
        # a periodic checkpoint's files must be renamed away from them first (_checkpoint).
        self.gang_locks: dict[str, threading.Lock] = {}
        self.bad_actions, self.stopping = 0, False
        self._last_report = self._last_look = 0.0
        self.fence = Fence(time.monotonic(), os.path.join(self.rundir.root, "cluster-fence"))
        self._jobs: dict[str, dict] = {}       # cjob -> its latest local record
        self._refusals: set = set()

    # --- plumbing ---
    def admin(self, mtype: str, timeout: float = 130.0, **fields):
        return self.gmuxd.call(mtype, timeout, **fields)

    def _event(self, event: str, cjob: str, detail: str = "", **data) -> None:
        self.outbox.put((event, cjob, detail, data))
        self.wakeup.set()

    def serve(self, until=None) -> None:
        poller = zmq.Poller()
        poller.register(self.up, zmq.POLLIN)
        poller.register(self.inbox, zmq.POLLIN)
        poller.register(self.bulk, zmq.POLLIN)
        poller.register(self.wakeup.fileno(), zmq.POLLIN)
        poller.register(self.handshake.socket, zmq.POLLIN)
        try:
            while not self.stopping and not (until and until()):
                look_s = STARTING_LOOK_S if self.starts.watched() else IDLE_POLL_MS / 1000
                for sock, _ in poller.poll(int(look_s * 1000)):
                    if sock == self.wakeup.fileno():
                        self.wakeup.clear()
                        continue
                    if sock is self.bulk:
                        sealed.serve_bulk(self.bulk, self.receiver.handle_sealed)
                        continue
                    if sock is self.handshake.socket:
                        self.handshake.handle()
                        continue
                    for _ in range(200):
                        try:
                            frames = sock.recv_multipart(zmq.NOBLOCK)
                        except zmq.Again:
                            break
                        if sock is self.up:
                            self._from_scheduler(frames)
                        else:
                            self.transfers.receive(frames[0], frames[1:])
                now = time.monotonic()
                if now - self._last_report >= REPORT_S:
                    self._last_report = self._last_look = now
                    self._report(now)
                    for cjob in self.fence.due(now, self._jobs):
                        self._fence_job(cjob, list(self.locals[cjob]))
                    self.receiver.expire()
                    self.handshake.check(now)
                elif self.starts.starting and now - self._last_look >= look_s:
                    self._last_look = now
                    self._report(now, full=False)
                # (after the look: a start it saw succeed is told at once)
                while True:
                    try:
                        event, cjob, detail, data = self.outbox.get_nowait()
                    except queue.Empty:
                        break
                    self._send_up("node_event", name=self.name, cjob=cjob, event=event, detail=detail[:2000], data=data)
        finally:
            self.close()

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.warm.close()
        self.handshake.close()
        self.up.close(0)
        self.inbox.close(0)
        self.bulk.close(0)
        self.guard.stop()
        self.receiver.close()
        self.ctx.term()
        self.wakeup.close()

    def _send_up(self, mtype: str, **fields) -> None:
        try:
            self.up.send(protocol.encode(mtype, 0, table=C, **fields), zmq.NOBLOCK)
        except zmq.Again:
            pass     # scheduler away: the next report carries the whole state again

    # --- checkpoints arriving ---
    def _xfer(self, req):
        ok, out = self.receiver.handle(req.msg, req.attachment)
        if not ok:
            raise protocol.ProtocolError(out)
        if isinstance(out, dict) and out.get("path"):
            self.starts.arrived(out["path"])
        return out

    # --- the report ---
    def _report(self, now: float, full: bool = True) -> None:
        """Reads gmuxd's jobs: events for starts that succeeded or failed, and (`full`) the report to the
        scheduler and periodic checkpoints. Not `full`: a look at the live jobs only, for the starts under way
        (what has ended, a start that failed, waits for the next full report)."""
        self.starts.reap()
        ps = self.gmuxd.look(all=full, limit=LINK_PS_LIMIT)
        if ps is None:
            return
        if not full:
            self.starts.look(ps["jobs"], self.world)
            return
        self.starts.unregistered(ps["jobs"])
        records = []
        for cjob, by_rank in ranks_by_job(ps["jobs"], self.starts.spawned).items():
            world = self.world.setdefault(cjob, max(by_rank) + 1)
            rec = gang_record(cjob, world, by_rank, bool(self.starts.restoring.get(cjob)))
            self.locals[cjob] = [j["id"] for _, j in sorted(by_rank.items())]
            if rec["state"] in protocol.FINAL_STATES:
                self.fence.forget(cjob)
            elif cjob in self.fence.fenced:
                rec["fenced"] = True
            records.append(rec)
            self._jobs[cjob] = rec
            if rec.pop("_broken") and cjob not in self.broken:
                self.broken.add(cjob)       # its peers would wait in their next collective for ever
                live = [j["id"] for j in by_rank.values() if j["state"] not in protocol.FINAL_STATES]
                self._work(cjob, self._ranks, cjob, "kill", None, live)
            self.starts.observe(cjob, rec, by_rank, world)
            if full:
                self._maybe_checkpoint(cjob, rec, list(by_rank.values()), now)
        if full:
            gpus = [{"index": g["index"], "mem_total": int(g["mem_total"])} for g in ps["gpus"]]
            self._send_up("node_report", name=self.name, gpus=gpus, transfer=self.transfer_endpoint, jobs=records)

    def _maybe_checkpoint(self, cjob: str, rec: dict, ranks: list, now: float) -> None:
        if cjob in self.busy or self.fence.cut_off(now):
            return
        seq = self.clock.due(cjob, rec, ranks, now)
        if seq is not None:
            self._work(cjob, self._checkpoint_to_scheduler, cjob, list(self.locals[cjob]), f"{self.name}-{cjob}-k{seq}")

    def _fence_job(self, cjob: str, ranks: list) -> None:
        def run():      # (on a thread of its own: the pool's may all be blocked sending checkpoints)
            self.fence.done(cjob, self._all_ranks(cjob, "suspend", ranks, **self.fence.stop_within()))
        threading.Thread(target=run, name="cluster-fence", daemon=True).start()

    def _work(self, cjob: str, fn, *args) -> None:
        self.busy.add(cjob)

        def run():
            try:
                fn(*args)
            except Exception as e:      # (a refusal, e.g. of a job that ended meanwhile, is said without a traceback)
                (log.warning if isinstance(e, GmuxError) else log.exception)("%s failed: %s", fn.__name__, e)
                self._event("action_failed", cjob, f"{fn.__name__}: {e}")
            finally:
                self.busy.discard(cjob)
        self.pool.submit(run)

    # --- actions from the scheduler ---
    def _from_scheduler(self, frames: list) -> None:
        try:
            if len(frames) != 1:
                raise protocol.ProtocolError("expected one frame")
            msg = protocol.decode(frames[0], C)
        except protocol.ProtocolError as e:
            self.bad_actions += 1
            log.warning("bad message from the scheduler: %s", e)
            self._refuse(frames, e)
            return
        try:
            if msg.type == "reply":
                if msg.get("ok"):
                    self.fence.heard(msg.get("data"), time.monotonic())
                elif msg.get("error") not in self._refusals:
                    self._refusals.add(msg.get("error"))      # (each report is refused alike: said once)
                    log.warning("scheduler refused: %s", msg.get("error"))
                return
            if msg.type != "node_action":
                raise protocol.ProtocolError(f"{msg.type} is not sent by a scheduler")
        except protocol.ProtocolError as e:
            self.bad_actions += 1
            log.warning("bad message from the scheduler: %s", e)
            return
        action, cjob, args = msg["action"], msg["cjob"], msg["args"]
        if self.fence.refuses(action, time.monotonic()):
            log.warning("cut off from the scheduler: its %s of %s, sent before, is not carried out", action, cjob)
            if action == "migrate_out":     # (a move waits for its send's outcome: without one, for good)
                self._event("migrate_failed", cjob, f"{self.name} was cut off from the scheduler as it arrived")
            return
        self.fence.acted_on(cjob, action)
        if action == "start":
            if not self._live(cjob):
                self._start(cjob, args)
            return
        if action == "abandon":
            self._abandon(cjob, args["of"], args.get("resume", True))
            return
        ranks = self.locals.get(cjob) if cjob in self._jobs else None
        if not ranks and action in ("kill", "release") and cjob in self.starts.starting:
            self.starts.cancel(cjob)      # e.g. started beside a move that then failed
            return
        if not ranks:
            self._event("action_failed", cjob, f"{action}: {cjob} does not run on {self.name}", action=action)
            return
        if action == "suspend":
            self._work(cjob, self._ranks, cjob, "suspend", "suspended", ranks)
        elif action == "resume":
            self._work(cjob, self._resume, cjob, ranks, args.get("gpu"))
        elif action == "kill":
            self._work(cjob, self._ranks, cjob, "kill", None, ranks)
        elif action == "release":
            # The job lives on elsewhere (or restarts, here too): this copy no longer speaks for it, its record
            # is not the next one's, and a start of it here is taken, not ignored for this copy.
            self.starts.spawned[cjob] = []
            self._jobs.pop(cjob, None)
            if cjob in self.starts.starting:
                self.starts.cancel(cjob)
            self._work(cjob, self._ranks, cjob, "kill", "released", ranks)
        elif action == "move":
            if len(ranks) > 1:
                self._event("action_failed", cjob, f"move: {cjob} is a gang of {len(ranks)} ranks; it moves "
                                                   f"between machines only", action="move")
            else:
                self._work(cjob, self._move, cjob, ranks[0], args["gpu"])
        elif action == "migrate_out":
            self.busy.add(cjob)   # no periodic checkpoint may start now
            stop = self.sending[cjob] = threading.Event()
            self._work(cjob, migrate_out, self, cjob, ranks, args["target"], args["endpoint"], args["xfer"], stop,
                       args.get("resume", True))

    def _abandon(self, cjob: str, of: str, resume: bool = True) -> None:
        """A move's target gives up its start (`of` "start"), its source its send ("send"). Each answers with
        how it ended: a start killed, "start_failed" (one that restored already goes on: "started"); a send
        stopped, its own outcome. One over before the word came said how it ended then, but a scheduler
        restarted since may never have heard it, and asks again: it is said again, or the move waited for good."""
        if of == "send":
            if cjob in self.sending:
                self.sending[cjob].set()
            else:
                self._work(cjob, self._no_send, cjob, self.locals.get(cjob) if cjob in self._jobs else [], resume)
        elif cjob in self.starts.starting:
            self.starts.abandon(cjob)
        else:
            rec = self._jobs.get(cjob) or {}
            if rec.get("state") in ("running", "suspended") and rec.get("step", 0) > 0:
                self._event("started", cjob, step=rec["step"], local=rec["local"])
            else:
                self._event("start_failed", cjob, "its move was given up: the checkpoint it waited for will not come")

    def _no_send(self, cjob: str, ranks: list, resume: bool = True) -> None:
        """A send given up that is over: the job runs on here (held, if its checkpoint went: a move that failed
        after it is taken as one that never happened), or stays suspended if it was before the move."""
        for local in ranks if resume else []:
            self._admin_reply("resume", local)
        self._event("migrate_failed", cjob, f"no send of it is under way on {self.name}: it "
                                            + ("runs on here" if resume else "stays suspended here"))

    def _refuse(self, frames: list, error: protocol.ProtocolError) -> None:
        """An action refused for its arguments still reaches the scheduler as a failure of that job, so the job
        does not wait for an outcome that never comes."""
        action, cjob = protocol.peek_action(frames[0]) if len(frames) == 1 else (None, None)
        if cjob is not None:
            event = {"start": "start_failed", "migrate_out": "migrate_failed"}.get(action, "action_failed")
            self._event(event, cjob, f"bad {action} arguments: {error}")

    def _live(self, cjob: str) -> bool:
        rec = self._jobs.get(cjob)
        return cjob in self.starts.starting or (rec is not None and rec["state"] not in protocol.FINAL_STATES
                                         and rec["state"] != "migrating")

    def _start(self, cjob: str, a: dict) -> None:
        paths = [self.receiver.path(x) for x in a.get("restore") or []]
        missing = [x for x, p in zip(a.get("restore") or [], paths) if not os.path.exists(p)]
        if missing and not a.get("restore_wait"):      # else still on the way: the processes wait for them
            self._event("start_failed", cjob, f"no received checkpoint {missing[0]!r} on {self.name}")
            return
        if a.get("restore_wait"):
            for x in a.get("restore") or []:
                self.receiver.expect_reader(x)
        self.starts.begin(cjob, paths)
        self.world[cjob] = len(a["gpus"])
        self.broken.discard(cjob)
        self._jobs.pop(cjob, None)
        self.clock.started(cjob, a.get("ckpt_every"), time.monotonic())
        self._work(cjob, self.starts.spawn, cjob, a, paths)

    def _gang_lock(self, cjob: str) -> threading.Lock:
        return self.gang_locks.setdefault(cjob, threading.Lock())

    def _ranks(self, cjob: str, mtype: str, event: Optional[str], ranks: list) -> None:
        error = self._all_ranks(cjob, mtype, ranks, **kill_reason(mtype, event))
        if error:
            self._event("action_failed", cjob, f"{mtype}: {error}", **busy_data(error))
        elif event:
            self._event(event, cjob)

    def _all_ranks(self, cjob: str, mtype: str, ranks: list, **fields) -> Optional[GmuxError]:
        """One admin request to every rank at once (a gang's ranks suspend only together): the first refusal."""
        with self._gang_lock(cjob) if mtype == "suspend" else contextlib.nullcontext():
            return next((e for e in each(lambda local: self._admin_reply(mtype, local, **fields)[0], ranks) if e), None)

    def _admin_reply(self, mtype: str, local: str, **fields) -> tuple[Optional[GmuxError], Optional[dict]]:
        """(gmuxd's refusal, or None; its reply, or None)."""
        try:
            reply = self.admin(mtype, job=local, **fields)
            return None, reply if isinstance(reply, dict) else None
        except GmuxError as e:
            return e, None

    def _resume(self, cjob: str, ranks: list, gpu) -> None:
        rec = self._jobs.get(cjob) or {}
        parked = rec.get("parked_gpu")
        if len(ranks) == 1 and isinstance(gpu, int) and parked is not None and gpu != parked:
            # (its process waits on that GPU; a plain resume would run it there, where the scheduler does not
            # count it)
            self._event("action_failed", cjob, f"resume: {cjob} gave GPU {parked} to another job while suspended "
                                               f"and resumes only there (or on another machine)",
                        action="resume", parked_gpu=parked)
            return
        try:
            if len(ranks) == 1 and isinstance(gpu, int) and rec.get("gpu") is not None and gpu != rec.get("gpu"):
                self.admin("migrate", job=ranks[0], gpu=gpu)
            for local in ranks:
                self.admin("resume", job=local)
        except GmuxError as e:
            self._event("action_failed", cjob, f"resume: {e}", action="resume", **busy_data(e))
            return
        self._event("resumed", cjob)

    def _move(self, cjob: str, local: str, gpu: int) -> None:
        try:
            self.admin("migrate", job=local, gpu=gpu)
        except GmuxError as e:
            self._event("action_failed", cjob, f"move: {e}", action="move", **busy_data(e))
            return
        self._event("moved", cjob, gpu=gpu)

    def _checkpoint(self, ranks: list) -> tuple[list, int]:
        """Has gmuxd get every rank's state written at one boundary; (a file per rank, the step it was taken at).
        Each file is renamed away from where gmuxd has the job write (the caller holds the gang's lock): a move
        that starts while it is still being sent makes that path its stream's pipe."""
        steps: dict = {}
        ask_one = self._checkpointer(steps)
        errors = [e for e in each(lambda local: staged(self._snapshot_path(local), lambda: ask_one(local)), ranks)
                  if e]
        if errors:
            raise GmuxError(str(errors[0]) if str(errors[0]).startswith("checkpoint") else f"checkpoint: {errors[0]}")
        paths = [self.rundir.checkpoint_file(local + ".periodic") for local in ranks]
        for local, path in zip(ranks, paths):
            os.replace(self._snapshot_path(local), path)
        return paths, taken_at(steps, ranks)

    def _checkpointer(self, steps: dict, holds: Optional[dict] = None) -> Callable[[str], Optional[GmuxError]]:
        """gmuxd's checkpoint command for one rank: its refusal or None; the step the rank's checkpoint
        holds goes into `steps` (from the job's own answer: the job steps on once it is written, so a later
        ps could name a step the checkpoint does not hold). `holds`: by rank, what a move's target offers
        (left out of the checkpoint)."""
        def ask(local: str) -> Optional[GmuxError]:
            offered = (holds or {}).get(local)
            error, reply = self._admin_reply("checkpoint", local, **({"holds": offered} if offered else {}))
            if error is None and reply is not None:
                steps[local] = reply.get("step")
            return error
        return ask

    def _snapshot_path(self, local: str) -> str:
        return self.rundir.checkpoint_file(local + ".snapshot")

    def _sender(self) -> dict:
        return dict(keydir=self.keydir, role="daemon", name=self.name, context=self.ctx)

    def _checkpoint_to_scheduler(self, cjob: str, ranks: list, xfer: str) -> None:
        with self._gang_lock(cjob):
            paths, step = self._checkpoint(ranks)
        try:
            xfers, r = send_files(paths, self.scheduler_endpoint, keys.load_public(self.keydir, "scheduler"), xfer,
                                  self._sender())
        finally:
            for path in paths:                 # (each sent one is gone already; one not sent is not kept)
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
        self._event("checkpointed", cjob, xfers=xfers, step=step, bytes=r["bytes"], sealed_bytes=r["sealed_bytes"],
                    seconds=r["seconds"])
