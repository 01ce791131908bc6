"""gmux.job.data_draws: whether a loader's data draws random numbers, tried in a forked child so that nothing the
trial does reaches the job's process."""
import os
import random
import time

import numpy as np
import torch
from torch.utils.data import TensorDataset, default_collate

from gmux.job import data_draws
from gmux.job.state import capture_rng


class Lazy(torch.utils.data.Dataset):
    """Opens its "file" on first use, as HDF5 and LMDB datasets do (such a handle must not cross a fork)."""

    def __init__(self, draw=None):
        self.handle, self.draw = None, draw

    def __len__(self):
        return 4

    def __getitem__(self, i):
        if self.handle is None:
            self.handle = os.getpid()
        if self.draw == "numpy":
            return torch.tensor(float(np.random.rand()))
        if self.draw == "random":
            return torch.tensor(random.random())
        if self.draw == "own":
            self.rng = getattr(self, "rng", None) or np.random.default_rng(1)
            return torch.tensor(float(self.rng.random()))
        if self.draw == "hang":
            time.sleep(30)
        return torch.tensor(float(i))


def test_each_stream_a_dataset_or_collate_function_draws_from_is_seen():
    collate = default_collate
    assert data_draws.draws(TensorDataset(torch.arange(8.0)), collate, 4) == (False, False, False)
    assert data_draws.draws(Lazy("numpy"), collate, 4) == (True, True, False)
    assert data_draws.draws(Lazy("random"), collate, 4) == (True, True, False)
    noisy = lambda items: default_collate(items) + torch.randn(len(items))     # noqa: E731
    assert data_draws.draws(Lazy(), noisy, 4) == (False, True, False)
    # a generator of its own, made at first use (a masking collator's seed=) or held (a dataset's default_rng):
    # the same random states give another result
    own = torch.Generator().manual_seed(5)
    masked = lambda items: default_collate(items) * torch.rand(len(items), generator=own)     # noqa: E731
    assert data_draws.draws(Lazy(), masked, 4) == (False, False, True)
    assert data_draws.draws(Lazy("own"), collate, 4) == (False, False, True)
    assert not data_draws.draws(Lazy(), collate, 4).any()


def test_the_trial_leaves_the_jobs_process_as_it_was():
    data = Lazy("numpy")
    before = capture_rng()
    assert data_draws.draws(data, default_collate, 4) == (True, True, False)
    assert data.handle is None                     # opened in the child only
    assert data_draws.same(before, capture_rng())  # and the child's draws are its own


def test_a_trial_that_fails_or_hangs_says_it_cannot_tell(monkeypatch):
    assert data_draws.draws(Lazy(), lambda items: 1 / 0, 4) is None
    assert data_draws.draws(None, default_collate, 4) is None
    monkeypatch.setattr(data_draws, "TRIAL_S", 0.5)
    t = time.monotonic()
    assert data_draws.draws(Lazy("hang"), default_collate, 4) is None
    assert time.monotonic() - t < 10               # the child was killed, not waited for


def test_data_that_only_looks_unequal_to_itself_is_not_taken_for_a_generator_of_its_own():
    """NaN in the data, items without __eq__, a batch held in an object: the repeat comes out the same."""
    class Holder:
        def __init__(self, x):
            self.x = x

    class Odd(torch.utils.data.Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            return {"x": torch.tensor([float("nan"), i]), "n": np.array([np.nan]), "f": float("nan"),
                    "h": Holder(torch.ones(2))}

    odd = lambda items: Holder([item["x"] for item in items])     # noqa: E731
    assert data_draws.draws(Odd(), odd, 4) == (False, False, False)


def test_a_script_ignoring_sigchld_still_gets_an_answer():
    import signal
    old = signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    try:
        assert data_draws.draws(TensorDataset(torch.arange(8.0)), default_collate, 4) is not None
    finally:
        signal.signal(signal.SIGCHLD, old)


class _Stream(torch.utils.data.IterableDataset):
    def __init__(self, draw=False):
        self.draw = draw

    def __iter__(self):
        for i in range(6):
            yield torch.tensor(float(i)) + (torch.rand(()) if self.draw else 0)


def test_a_stream_is_tried_from_a_new_iterator_of_it():
    """An IterableDataset has no dataset[i]: the trial failed, and a loader of one over persistent workers was
    refused every move after its first epoch, as data that 'could not be tried' (a reviewer's repro)."""
    assert data_draws.draws(_Stream(), default_collate, 4) == (False, False, False)
    assert data_draws.draws(_Stream(draw=True), default_collate, 4) == (True, True, False)
