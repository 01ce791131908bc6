"""A thread of the script's own saving the model's state_dict over and over (an async checkpointer) while the main
thread trains; run under `python -m gmux.job.run --cycle-every 1`, some saves fall while the job is suspended.
Prints how many saves were made and how many of them do not load whole.

usage: thread_saves.py [--resident]   (--resident: each save inside `with gmux.job.resident():`)"""
import contextlib
import io
import sys
import threading

import torch
import torch.nn.functional as F
from torch import nn

import gmux.job

resident = gmux.job.resident if "--resident" in sys.argv else contextlib.nullcontext
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 256), nn.ReLU(), nn.Linear(256, 1))
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
X, Y = torch.randn(120, 16, 8), torch.randn(120, 16, 1)
stop, bad, saves = threading.Event(), [], [0]


def save_again_and_again():
    while not stop.is_set():
        buf = io.BytesIO()
        with resident():
            torch.save(model.state_dict(), buf)
        saves[0] += 1
        try:
            state = torch.load(io.BytesIO(buf.getvalue()))
            if any(v.numel() == 0 or not torch.isfinite(v).all() for v in state.values()):
                bad.append("empty or not finite")
        except Exception as e:
            bad.append(f"{type(e).__name__}: {str(e)[:100]}")


saver = threading.Thread(target=save_again_and_again, name="saver", daemon=True)
saver.start()
for i in range(len(X)):
    opt.zero_grad()
    F.mse_loss(model(X[i]), Y[i]).backward()
    opt.step()
stop.set()
saver.join()
print(f"{saves[0]} saves, {len(bad)} broken: {bad[:1]}")
