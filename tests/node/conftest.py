"""Fixtures of this folder; the helpers behind them live in node_harness.py, which tests import by that name."""
from node_harness import daemon, daemon_factory, node_factory  # noqa: F401 (fixtures, found by pytest here)
