import pytest


@pytest.fixture
def tmp(tmp_path):
    return str(tmp_path)


# Files whose tests start real daemons take a minute or two each; the rest take seconds. With two workers
# (`make test`), running the long ones first leaves only short files for the end, so neither worker idles
# while the other finishes a long file (xdist's default order puts the files with most tests first).
SLOW_FIXTURES = {"node_factory", "cluster_factory"}


def pytest_collection_modifyitems(config, items):
    slow_files = {item.nodeid.split("::")[0] for item in items if SLOW_FIXTURES & set(item.fixturenames)}
    items.sort(key=lambda item: item.nodeid.split("::")[0] not in slow_files)
