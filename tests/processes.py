"""Process checks shared by the tests that must prove no worker is left behind."""

import os


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie (exited, not yet reaped) counts as gone
        return f.read().split(")")[-1].split()[0] != "Z"


def alive_after(pids, timeout: float = 60) -> list[int]:
    """The pids still alive once they all exited or `timeout` seconds passed (a bound, not a measurement)."""
    import time

    deadline = time.monotonic() + timeout
    while any(map(pid_alive, pids)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return [pid for pid in pids if pid_alive(pid)]


def _processes():
    """(pid, parent pid, command line) of every process now."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().split(")")[-1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                command = f.read().replace(b"\0", b" ")
        except (OSError, ValueError):
            continue
        yield int(entry), ppid, command


def launched_workers(parent: int | None = None) -> list[int]:
    """Live worker launchers (launcher.py, which runs torchrun) started by `parent` (default: this process),
    i.e. the worker groups it launched."""
    parent = os.getpid() if parent is None else parent
    return [pid for pid, ppid, command in _processes()
            if ppid == parent and b"distributed/launcher.py" in command and pid_alive(pid)]


def children(parent: int) -> list[int]:
    """Live child processes of `parent` (e.g. the ranks under a torchrun launcher)."""
    return [pid for pid, ppid, _ in _processes() if ppid == parent and pid_alive(pid)]
