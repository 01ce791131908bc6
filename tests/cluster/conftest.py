"""Fixtures of this folder; the helpers behind them live in sim_harness.py, which tests import by that name."""
from sim_harness import table  # noqa: F401 (a fixture, found by pytest here)
