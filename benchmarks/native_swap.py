"""Host-backend (virtual GPU) allocator-tier suspend and resume, against memcpy measured in the same run.

For 256 MiB and 1 GiB of allocations with 10%, 50% and 100% of their bytes live (live ranges spread
through every allocation, as a caching allocator's active blocks are): the copy phases' throughput
against memcpy of the same bytes into (and back from) a warm buffer, the map/unmap and store-staging
times apart, and end-to-end suspend+resume time. Prints a table, writes
benchmarks/results/native_swap.json; the last line is
  native_swap_1GiB: copy_vs_memcpy=<ratio> live_only_speedup_at_10pct=<ratio> end_to_end_ms=<n>
copy_vs_memcpy: copy-phase time over memcpy time for the same bytes (1 GiB, 100% live; target <= 1.3).
live_only_speedup_at_10pct: copy phases at 100% live over those at 10% (1 GiB; target >= 5).
end_to_end_ms: suspend + resume wall time, 1 GiB, 100% live.

    .venv/bin/python benchmarks/native_swap.py [--reps 5]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import zlib

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from gmux.job.memory import native as na  # noqa: E402

MiB = 1 << 20
SLOT = 1 * MiB  # live ranges: the first fraction of every 1 MiB slot of every allocation


def live_ranges(allocs, fraction):
    out = []
    for address, size in allocs:
        for off in range(0, size, SLOT):
            n = int(min(SLOT, size - off) * fraction)
            if n:
                out.append((address + off, n))
    return out


def checksum(ranges):
    ffi = na._native.ffi
    crc = 0
    for address, n in ranges:
        crc = zlib.crc32(ffi.buffer(ffi.cast("char *", address), n), crc)
    return crc


def memcpy_baseline(ranges, warm, out: bool) -> float:
    """memmove of the same ranges into (out) or back from (not out) a warm, pre-faulted buffer."""
    ffi = na._native.ffi
    dst = ffi.from_buffer(warm)
    t0 = time.perf_counter()
    off = 0
    for address, n in ranges:
        src = ffi.cast("char *", address)
        if out:
            ffi.memmove(dst + off, src, n)
        else:
            ffi.memmove(src, dst + off, n)
        off += n
    return time.perf_counter() - t0


def run(total: int, fractions, reps: int) -> list[dict]:
    """One set of allocations; the live fractions are measured interleaved, rep by rep, so that noise from
    other work on the machine hits them alike. Each figure is the best of `reps` (the uncontended cost)."""
    nalloc = 16
    pool = na.Pool.create(total + 64 * MiB)
    a = na.Allocator.host(pool)
    ffi = na._native.ffi
    allocs = []
    for i in range(nalloc):
        size = total // nalloc
        address = a.malloc(size)
        buf = ffi.buffer(ffi.cast("char *", address), size)
        pattern = bytes((i * 31 + k * 7) % 251 + 1 for k in range(MiB))
        for off in range(0, size, len(pattern)):  # distinct, non-zero bytes everywhere
            chunk = pattern[: min(len(pattern), size - off)]
            buf[off:off + len(chunk)] = chunk
        allocs.append((address, size))
    plans = {f: live_ranges(allocs, f) for f in fractions}
    sums = {f: checksum(r) for f, r in plans.items()}
    warm = bytearray(sum(n for _, n in plans[max(fractions)]))  # zero-filled: faulted in
    a.suspend(plans[max(fractions)])  # the first cycle grows the host store once; not measured
    a.resume()
    rows: dict = {f: [] for f in fractions}
    for _ in range(reps):
        for f, ranges in plans.items():
            s = a.suspend(ranges)
            r = a.resume()
            if checksum(ranges) != sums[f]:
                raise SystemExit(f"live bytes changed across suspend/resume ({total >> 20} MiB, {f:.0%} live)")
            m_out = memcpy_baseline(ranges, warm, True)
            m_in = memcpy_baseline(ranges, warm, False)
            rows[f].append({"suspend_copy_s": s["copy_s"], "resume_copy_s": r["copy_s"], "unmap_s": s["map_s"],
                            "map_s": r["map_s"], "stage_s": s["stage_s"] + r["stage_s"], "suspend_s": s["total_s"],
                            "resume_s": r["total_s"], "memcpy_out_s": m_out, "memcpy_in_s": m_in})
    a.close()
    pool.close()
    out = []
    for f, ranges in plans.items():
        live = sum(n for _, n in ranges)
        best = {k: min(row[k] for row in rows[f]) for k in rows[f][0]}
        copy = min(row["suspend_copy_s"] + row["resume_copy_s"] for row in rows[f])
        memcpy = min(row["memcpy_out_s"] + row["memcpy_in_s"] for row in rows[f])
        end_to_end = min(row["suspend_s"] + row["resume_s"] for row in rows[f])
        out.append({"total_bytes": total, "live_fraction": f, "live_bytes": live, "ranges": len(ranges), **best,
                    "copy_s": copy, "memcpy_s": memcpy, "copy_GBps": 2 * live / copy / 1e9,
                    "memcpy_GBps": 2 * live / memcpy / 1e9, "copy_vs_memcpy": copy / memcpy,
                    "end_to_end_s": end_to_end, "reps": reps, "all_reps": rows[f]})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out",
                    default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "native_swap.json"))
    args = ap.parse_args()
    if not na.available():
        raise SystemExit("gmux._native is not built: pip install -e . first")
    results = [row for total in (256 * MiB, 1024 * MiB) for row in run(total, (0.1, 0.5, 1.0), args.reps)]
    head = (f"{'size':>6} {'live':>5} {'copy GB/s':>9} {'memcpy GB/s':>11} {'copy/memcpy':>11} {'unmap ms':>8} "
            f"{'map ms':>7} {'stage ms':>8} {'suspend ms':>10} {'resume ms':>9}")
    print(head)
    print("-" * len(head))
    for r in results:
        print(f"{r['total_bytes'] >> 20:>4}Mi {r['live_fraction']:>5.0%} {r['copy_GBps']:>9.2f} "
              f"{r['memcpy_GBps']:>11.2f} {r['copy_vs_memcpy']:>11.2f} {r['unmap_s'] * 1e3:>8.1f} "
              f"{r['map_s'] * 1e3:>7.1f} {r['stage_s'] * 1e3:>8.1f} {r['suspend_s'] * 1e3:>10.1f} "
              f"{r['resume_s'] * 1e3:>9.1f}")
    big = {r["live_fraction"]: r for r in results if r["total_bytes"] == 1024 * MiB}
    summary = {"copy_vs_memcpy": big[1.0]["copy_vs_memcpy"],
               "live_only_speedup_at_10pct": big[1.0]["copy_s"] / big[0.1]["copy_s"],
               "end_to_end_ms": big[1.0]["end_to_end_s"] * 1e3}
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"benchmark": "native_swap", "backend": "host", "results": results, "summary": summary,
                   "cpu_count": os.cpu_count()}, f, indent=2)
    print(f"(best of {args.reps}, fractions interleaved; copy phases: both directions; unmap/map run on the helper "
          f"thread, overlapping the copies; stage = mapping+unmapping the host store; JSON in "
          f"{os.path.relpath(args.out)})")
    print(f"native_swap_1GiB: copy_vs_memcpy={summary['copy_vs_memcpy']:.2f} "
          f"live_only_speedup_at_10pct={summary['live_only_speedup_at_10pct']:.2f} "
          f"end_to_end_ms={summary['end_to_end_ms']:.0f}")


if __name__ == "__main__":
    main()
