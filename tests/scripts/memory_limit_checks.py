"""usage: memory_limit_checks.py CHECK — one check of the CPU memory limiter (gmux/job/memory/limit.py) in a
process of its own (the limiter replaces torch's CPU allocator for the rest of the process); prints 'ok CHECK'
when every assertion held. Run by tests/test_memory_limit.py."""
import os
import sys
import threading

import torch

from gmux.job.memory import limit as ml

MiB = 1 << 20


def refuse():
    """Past the limit the allocation fails with torch's OOM error naming job, limit and how to raise it;
    nothing is counted for it; a free gives room back; the figures say limit, in use, peak."""
    e = ml.enforce(64 * MiB, job="j7", name="big", soft=False, cuda=False)
    kept = torch.ones(40 * MiB, dtype=torch.uint8)
    before = e.figures()
    assert before["mem_limit"] == 64 * MiB and before["mem_enforced"] == "enforced", before
    assert 40 * MiB <= before["mem_in_use"] < 41 * MiB, before
    try:
        torch.empty(30 * MiB, dtype=torch.uint8)
    except torch.OutOfMemoryError as err:
        text = str(err)
    else:
        raise AssertionError("30 MiB past a 64 MiB limit with 40 MiB in use was allowed")
    for words in ("job j7 (big)", "memory limit of 64.0MiB", "tried to allocate 30.0MiB", "gmux-launch --mem"):
        assert words in text, (words, text)
    after = e.figures()
    assert after["mem_in_use"] == before["mem_in_use"] and after["mem_refused"] == 1, after
    del kept
    again = torch.ones(60 * MiB, dtype=torch.uint8)   # freed memory is room again
    f = e.figures()
    assert 60 * MiB <= f["mem_peak"] <= 64 * MiB and f["mem_in_use"] >= 60 * MiB, f
    pid = os.fork()          # a forked process (a DataLoader worker) is not the job's device: never refused
    if pid == 0:
        try:   # allocation only: a parallel fill after fork may hang in the child's OpenMP runtime
            os._exit(0 if torch.empty(100 * MiB, dtype=torch.uint8).numel() == 100 * MiB else 1)
        except BaseException:
            os._exit(2)
    assert os.waitpid(pid, 0)[1] == 0
    del again
    assert e.figures()["mem_peak"] >= 60 * MiB        # the peak since the previous report...
    f = e.figures()                                   # ...restarts from what is in use at each report
    assert f["mem_peak"] == f["mem_in_use"] < MiB, f


def small():
    """A refusal's figures are in the unit of its limit: under a limit of 100 KiB, "tried to allocate 0.0MiB
    with 0.0MiB in use"."""
    ml.enforce(100 << 10, job="j8", cuda=False)
    kept = torch.ones(60 << 10, dtype=torch.uint8)
    try:
        torch.empty(50 << 10, dtype=torch.uint8)
    except torch.OutOfMemoryError as err:
        text = str(err)
    else:
        raise AssertionError("50 KiB past a 100 KiB limit with 60 KiB in use was allowed")
    assert "memory limit of 100.0KiB: tried to allocate 50.0KiB with 6" in text and "KiB in use" in text, text
    del kept


def host_scope():
    """The runtime's host copies (host_memory) are not the job's device memory."""
    e = ml.enforce(16 * MiB, job="j1", cuda=False)
    with ml.host_memory():
        host = torch.empty(64 * MiB, dtype=torch.uint8)
    assert e.figures()["mem_in_use"] < MiB
    device = torch.ones(8 * MiB, dtype=torch.uint8)
    del host                                          # freeing uncounted memory takes nothing off the count
    assert e.figures()["mem_in_use"] >= 8 * MiB
    del device


def soft():
    """GMUX_MEM_SOFT=1: counted and reported, never refused."""
    os.environ["GMUX_MEM_SOFT"] = "1"                 # as gmux-launch --mem-soft sets it
    e = ml.enforce(8 * MiB, job="j2", cuda=False)
    big = torch.ones(32 * MiB, dtype=torch.uint8)
    f = e.figures()
    assert f["mem_limit_soft"] and f["mem_enforced"] == "counted" and f["mem_in_use"] >= 32 * MiB, f
    del big


def unlimited():
    """No --mem on a virtual GPU: nothing is refused, and the peak reported is the tensors', not the process's
    resident size (which counts torch's own import: 100 MiB and more)."""
    e = ml.enforce(None, cuda=False)
    big = torch.ones(200 * MiB, dtype=torch.uint8)
    f = e.figures()
    assert f["mem_enforced"] == "measured" and not f["mem_limit"] and not f["mem_limit_soft"], f
    assert 200 * MiB <= f["mem_in_use"] < 201 * MiB and 200 * MiB <= f["mem_peak"] < 201 * MiB, f
    del big
    e.figures()                                       # (a report's peak is since the report before)
    small = torch.ones(MiB, dtype=torch.uint8)
    f = e.figures()
    assert MiB <= f["mem_peak"] < 2 * MiB and f["mem_refused"] == 0, f
    assert ml.enforce(None, cuda=True) is None        # on a GPU torch's own statistics measure it
    del small


def pools():
    """A virtual GPU's pools count with the tensors: a DevicePool region and the native Pool's placed storages
    are claimed from the same count and given back when they die; past the limit a region is refused with
    torch's OOM error and the pool gets it back."""
    from gmux.job.memory import native as na
    from gmux.job.memory.python_pool import DevicePool
    e = ml.enforce(32 * MiB, job="j3", cuda=False)
    pool = DevicePool(128 * MiB)
    region = pool.storage(20 * MiB)
    assert e.figures()["mem_in_use"] >= 20 * MiB
    try:
        pool.storage(20 * MiB)
    except torch.OutOfMemoryError as err:
        assert "memory limit of 32.0MiB" in str(err), err
    else:
        raise AssertionError("a pool region past the limit was handed out")
    assert pool.in_use == 20 * MiB, pool.in_use          # the refused region went back to the pool
    del region
    assert e.figures()["mem_in_use"] < MiB and pool.in_use == 0
    if na.available():
        p = na.Pool.create(64 * MiB)
        a = na.Allocator.host(p)
        t = torch.ones(4 * MiB)                          # 16 MiB on the heap
        e.figures()                                      # (a report's peak is since the report before)
        na.place(a, [t])                                 # moved into the pool: counted once, not twice
        f = e.figures()
        assert 16 * MiB <= f["mem_in_use"] < 17 * MiB and float(t.sum()) == 4 * MiB, f
        assert f["mem_peak"] < 17 * MiB, f               # nor, while it moves, at a peak of both copies
        del t
        assert e.figures()["mem_in_use"] < MiB


def threads():
    """Two threads allocating at once can never both slip past the limit."""
    e = ml.enforce(100 * MiB, job="j4", cuda=False)
    held, refused, go = [], [], threading.Barrier(4)

    def grab():
        go.wait()
        for _ in range(10):
            try:
                held.append(torch.empty(4 * MiB, dtype=torch.uint8))
            except torch.OutOfMemoryError:
                refused.append(1)
    workers = [threading.Thread(target=grab) for _ in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert len(held) == 25 and len(refused) == 15, (len(held), len(refused))   # 25 x 4 MiB = the limit
    assert e.figures()["mem_in_use"] <= 100 * MiB


def restore():
    """A restore reads the checkpoint as host memory: a job whose state is 64 of its 112 MiB restores
    (counted, it would need its state twice), and what it keeps of the checkpoint (Adam's state) is counted."""
    import io
    import gmux.job
    e = ml.enforce(112 * MiB, job="j5", cuda=False)   # its steps peak at 96 MiB (Adam's temporaries)
    torch.manual_seed(0)
    model = torch.nn.Linear(2048, 2048)                       # 16 MiB of weights
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    job = gmux.job.attach(model, opt)

    def step():
        loss = model(torch.randn(4, 2048)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    step()                                                    # weights, gradients, two Adam moments: 64 MiB
    buf = io.BytesIO()
    job.checkpoint(buf)
    live = e.figures()["mem_in_use"]
    assert 64 * MiB <= live < 65 * MiB, live
    job.restore(buf.getvalue())
    after = e.figures()["mem_in_use"]
    assert abs(after - live) < MiB, (live, after)             # the moments it kept are counted, once
    step()
    assert e.figures()["mem_refused"] == 0


def lstm():
    """oneDNN's LSTM kernels allocate through the CPU allocator's raw interface and free null pointers through it
    (as free() allows): under the limiter an LSTM's forward and backward ran into a segmentation fault."""
    e = ml.enforce(256 * MiB, job="j6", cuda=False)
    torch.manual_seed(0)
    lstm = torch.nn.LSTM(1, 12, batch_first=True)
    out, _ = lstm(torch.randn(8, 40, 1))
    out.sum().backward()
    assert e.figures()["mem_refused"] == 0 and e.figures()["mem_in_use"] > 0


if __name__ == "__main__":
    check = sys.argv[1]
    {"refuse": refuse, "host_scope": host_scope, "soft": soft, "pools": pools, "threads": threads,
     "restore": restore, "lstm": lstm, "unlimited": unlimited, "small": small}[check]()
    print(f"ok {check}")
