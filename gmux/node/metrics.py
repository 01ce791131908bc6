"""Prometheus metrics of a gmuxd (`--metrics-port P`): per GPU and per job.

The daemon's loop owns its tables; the HTTP server runs on its own thread. So the loop publishes an immutable
snapshot once a second and the collector only reads that snapshot, never the live tables.
"""
from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import GaugeMetricFamily, CounterMetricFamily

from gmux.protocol import JOB_STATES


class Metrics:
    def __init__(self, daemon, port: int, addr: str = "127.0.0.1"):
        self.daemon = daemon
        self.snapshot: dict = {"jobs": [], "gpus": [], "messages": 0, "internal_errors": 0, "host_held": 0}
        self._last = 0.0
        self.registry = CollectorRegistry()
        self.registry.register(self)
        try:
            self.server, self.thread = start_http_server(port, addr=addr, registry=self.registry)
        except OSError as e:
            raise OSError(f"--metrics-port {port}: cannot serve metrics on {addr}:{port}: {e.strerror}") from None

    def close(self) -> None:
        self.server.shutdown()

    def update(self, every: float = 1.0) -> None:
        now = time.monotonic()
        if now - self._last < every:
            return
        self._last = now
        d = self.daemon
        jobs = [(j.id, j.gpu, j.state, j.rate_running() or 0.0, j.rate_solo or 0.0, j.mem_boundary or 0,
                 j.mem_peak or 0, j.suspends, j.suspend_seconds, j.host_bytes, j.gpu_seconds, j.step)
                for j in d.jobs.values() if not j.final]
        gpus = [(g.index, g.mem_total, len(d.slicers[g.index].entries), len(d.slicers[g.index].resident),
                 d.slicers[g.index].switches) for g in d.gpus.values()]
        self.snapshot = {"jobs": jobs, "gpus": gpus, "messages": d.messages, "internal_errors": d.internal_errors,
                         "host_held": sum(j[9] for j in jobs)}   # one reference swap: atomic for the reader

    def collect(self):
        s = self.snapshot
        g_mem = GaugeMetricFamily("gmux_gpu_memory_bytes", "GPU memory (virtual GPUs: the budget)", labels=["gpu"])
        g_jobs = GaugeMetricFamily("gmux_gpu_jobs", "jobs assigned to the GPU", labels=["gpu"])
        g_res = GaugeMetricFamily("gmux_gpu_resident_jobs", "jobs holding the GPU now", labels=["gpu"])
        g_sw = CounterMetricFamily("gmux_gpu_switches", "time-slice switches", labels=["gpu"])
        for idx, mem, n, r, sw in s["gpus"]:
            g_mem.add_metric([str(idx)], mem)
            g_jobs.add_metric([str(idx)], n)
            g_res.add_metric([str(idx)], r)
            g_sw.add_metric([str(idx)], sw)
        yield from (g_mem, g_jobs, g_res, g_sw)
        state = GaugeMetricFamily("gmux_job_state", "1 for the job's current state", labels=["job", "gpu", "state"])
        fams = {k: GaugeMetricFamily(f"gmux_job_{k}", h, labels=["job", "gpu"]) for k, h in (
            ("rate", "mini-batches per second now"), ("rate_solo", "mini-batches per second measured alone"),
            ("mem_boundary_bytes", "memory at the mini-batch boundary"), ("mem_peak_bytes", "peak memory"),
            ("host_bytes", "host RAM holding its suspended state"), ("gpu_seconds", "seconds resident on its GPU"),
            ("step", "mini-batches done"))}
        suspends = CounterMetricFamily("gmux_job_suspends", "suspends", labels=["job", "gpu"])
        suspend_s = CounterMetricFamily("gmux_job_suspend_seconds", "seconds spent suspending and resuming",
                                        labels=["job", "gpu"])
        for (jid, gpu, st, rate, solo, mb, mp, ns, ss, hb, gs, step) in s["jobs"]:
            lab = [jid, str(gpu)]
            for name in JOB_STATES:
                state.add_metric(lab + [name], 1.0 if name == st else 0.0)
            for k, v in (("rate", rate), ("rate_solo", solo), ("mem_boundary_bytes", mb), ("mem_peak_bytes", mp),
                         ("host_bytes", hb), ("gpu_seconds", gs), ("step", step)):
                fams[k].add_metric(lab, v)
            suspends.add_metric(lab, ns)
            suspend_s.add_metric(lab, ss)
        yield state
        yield from fams.values()
        yield suspends
        yield suspend_s
        held = GaugeMetricFamily("gmux_host_held_bytes", "host RAM holding suspended jobs' state")
        held.add_metric([], s["host_held"])
        yield held
        msgs = CounterMetricFamily("gmux_messages", "messages received")
        msgs.add_metric([], s["messages"])
        yield msgs
        errors = CounterMetricFamily("gmux_internal_errors", "bugs gmuxd met and went on from (its log has each)")
        errors.add_metric([], s["internal_errors"])
        yield errors
