import pytest


@pytest.fixture
def tmp(tmp_path):
    return str(tmp_path)


def _tails(root, lines: int = 40, files: int = 12) -> str:
    """The last lines of the logs that the processes of a test wrote under its tmp_path, newest last."""
    logs = sorted((p for p in root.rglob("*.log") if p.is_file()), key=lambda p: p.stat().st_mtime)[-files:]
    out = []
    for p in logs:
        text = p.read_bytes()[-64 << 10:].decode("utf-8", "replace").splitlines()[-lines:]
        out.append(f"--- {p.relative_to(root)} (last {len(text)} lines)\n" + "\n".join(text))
    return "\n".join(out)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    # A failed end-to-end test on CI leaves only its assertion behind: show what its daemons and jobs said.
    report = (yield).get_result()
    tmp_path = getattr(item, "funcargs", {}).get("tmp_path")
    if report.failed and tmp_path is not None and tmp_path.exists():
        tails = _tails(tmp_path)
        if tails:
            report.sections.append(("logs of its processes", tails))
