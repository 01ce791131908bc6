"""Torch-free helpers every layer of gmux may import: sizes, atomic files, ports, SQLite with the decision log.
Nothing here imports anything else of gmux."""
