"""Fixtures of this folder; the helpers behind them live in cluster_harness.py, which tests import by that name."""
from cluster_harness import cluster_factory  # noqa: F401 (a fixture, found by pytest here)
