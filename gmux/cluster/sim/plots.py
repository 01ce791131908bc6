"""Plots of a simulation (matplotlib, PNG, no display needed): JCT CDF per policy, GPU utilisation over time."""
from __future__ import annotations

import os

import numpy as np

from gmux.cluster.sim.metrics import job_table, utilisation_series
from gmux.util.atomic import atomic_open


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")      # headless: CI machines and the simulator never need a display
    import matplotlib.pyplot as plt
    return plt


def _save(plt, fig, ax, path: str) -> str:
    """Written atomically: a disk that fills up mid-write left a truncated PNG under the plot's name."""
    try:
        ax.legend()
        fig.tight_layout()
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        # (through a link: the file it names is replaced, as --json's; a plot is for everyone to read)
        with atomic_open(os.path.realpath(path), mode=0o644) as f:
            fig.savefig(f, dpi=110, format="png")
    finally:
        plt.close(fig)
    return path


def plot_jct_cdf(results: dict, path: str, title: str = "") -> str:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for policy, runs in results.items():
        t = job_table(runs)
        if not len(t["job_id"]):
            continue
        jct = np.sort(t["finish"] - t["submit"]) / 3600.0
        ax.plot(jct, np.arange(1, len(jct) + 1) / len(jct), label=policy)
    ax.set_xscale("log")
    ax.set_xlabel("job completion time (hours, log scale)")
    ax.set_ylabel("fraction of jobs")
    ax.set_title(title or "JCT CDF per policy")
    ax.grid(True, which="both", alpha=0.3)
    return _save(plt, fig, ax, path)


def windows(hours: np.ndarray, util: np.ndarray, smooth_h: float) -> tuple[np.ndarray, np.ndarray, float]:
    """(start hours, mean utilisation, window hours) over windows of whole buckets of the series (which a long
    trace widens past an hour) nearest `smooth_h` hours, at least one bucket; the last window may be shorter."""
    bucket_h = float(hours[1] - hours[0]) if len(hours) > 1 else 1.0
    k = max(1, round(smooth_h / bucket_h))
    starts = np.arange(0, len(util), k)
    return hours[starts], np.add.reduceat(util, starts) / np.diff(np.append(starts, len(util))), k * bucket_h


def plot_utilisation(results: dict, path: str, title: str = "", smooth_h: int = 24) -> str:
    """Busy GPUs over all clusters' GPUs, averaged over windows of about `smooth_h` hours so bursts stay visible."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 4))
    window_h = float(smooth_h)
    for policy, runs in results.items():
        hours, util = utilisation_series(runs)
        if len(util):
            hours, util, window_h = windows(hours, util, smooth_h)
            ax.plot(hours / 24.0, 100 * util, label=policy, lw=1)
    ax.set_xlabel("days since the first submission")
    ax.set_ylabel(f"GPUs busy (%, {window_h:g} h mean)")
    ax.set_title(title or "GPU utilisation over time")
    ax.grid(True, alpha=0.3)
    return _save(plt, fig, ax, path)


def plot_load_curve(curve: dict, path: str, title: str = "") -> str:
    """Average JCT (hours, log scale) against load, one line per policy. `curve`: {policy: {vc_scale: jct_s}};
    load is drawn as 1/vc_scale (x2 = half the machines), so heavier load is to the right."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for policy, pts in curve.items():
        xs = sorted(pts, reverse=True)
        ax.plot([1.0 / x for x in xs], [pts[x] / 3600.0 for x in xs], marker="o", label=policy)
    ax.set_yscale("log")
    ax.set_xlabel("load relative to Philly's own VC sizes (1 / VC scale)")
    ax.set_ylabel("average JCT (hours, log scale)")
    ax.set_title(title or "Average JCT against load")
    ax.grid(True, which="both", alpha=0.3)
    return _save(plt, fig, ax, path)
