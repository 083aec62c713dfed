"""One real ComfyUI server for the whole reliability suite (harness.start_server), and the closing
report of its counts (bad inputs tried, faults survived, RSS growth over the soak), which the tests
also print as they run (pytest -s)."""

import pytest

from harness import REPORT, start_server


@pytest.fixture(scope="session")
def server(tiny_dir, tmp_path_factory):
    running = start_server(tmp_path_factory.mktemp("reliability"), tiny_dir)
    try:
        yield running
    finally:
        running.stop()


def pytest_terminal_summary(terminalreporter):
    if REPORT:
        terminalreporter.section("reliability")
        for name, value in REPORT.items():
            terminalreporter.write_line(f"{name}: {value}")
