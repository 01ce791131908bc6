"""Fixtures of this folder; the helpers behind them live in sim_harness.py, which tests import by that name."""
from sim_harness import table

__all__ = ["table"]   # a fixture, found by pytest here (not unused)
