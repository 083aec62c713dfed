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


def launched_workers(parent_pid: int | None = None) -> list[int]:
    """Live torchrun launchers started by `parent_pid` (this process by default): the worker groups it launched."""
    parent_pid = parent_pid or os.getpid()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                parent = int(f.read().split(")")[-1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                command = f.read().replace(b"\0", b" ")
        except (OSError, ValueError):
            continue
        if parent == parent_pid and b"torch.distributed.run" in command and pid_alive(int(entry)):
            found.append(int(entry))
    return found
