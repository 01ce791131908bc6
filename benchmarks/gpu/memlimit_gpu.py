"""GPU check of a job's memory limit through gmux's routed allocator (gmux/job/memory/limit.py), run by
validate.sh: with every torch CUDA allocation routed through gmux and a 512 MiB limit, 256 MiB are given, 384 MiB
more are refused with torch.OutOfMemoryError (gmux's words on stderr just before it), nothing allocated before is
touched, and the job allocates again within its limit afterwards. Prints one line per check; exits 1 on a failure.
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
MiB = 1 << 20


def main() -> int:
    if not torch.cuda.is_available():
        print("memory limit on a GPU: skipped (no GPU)")
        return 0
    from gmux.job.memory import device_memory, native
    from gmux.job.memory.limit import enforced
    if not native.available():
        print("memory limit on a GPU: skipped (gmux._native is not built)")
        return 0
    device_memory(0, True, 512 * MiB, job="gpu-check", name="memlimit")
    e = enforced()
    print("enforced by:", e.how)
    kept = torch.full((256 * MiB,), 7, dtype=torch.uint8, device="cuda")
    try:
        torch.empty(384 * MiB, dtype=torch.uint8, device="cuda")
    except torch.OutOfMemoryError as err:
        print("refused as expected:", str(err).splitlines()[0][:160])
    else:
        print("FAIL: 384 MiB more than 256 MiB under a 512 MiB limit were given")
        return 1
    f = e.figures()
    ok = f.get("mem_refused", 1) >= 1 and f["mem_in_use"] <= 512 * MiB and int(kept.sum()) == 7 * 256 * MiB
    more = torch.ones(128 * MiB, dtype=torch.uint8, device="cuda")    # within the limit: still served
    ok = ok and int(more.sum()) == 128 * MiB
    print(f"{'ok' if ok else 'FAIL'}: figures {f}; the kept 256 MiB intact; 128 MiB more given after the refusal")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
