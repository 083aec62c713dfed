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


def listening_addresses(pid: int) -> list[str]:
    """The local address ("host:port") of every TCP socket process `pid` listens on, from /proc."""
    import ipaddress

    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:["):-1])
    found = []
    for table in ("tcp", "tcp6"):
        with open(f"/proc/{pid}/net/{table}") as f:
            for row in f.read().splitlines()[1:]:
                fields = row.split()
                local, state, inode = fields[1], fields[3], fields[9]
                if state != "0A" or inode not in inodes:  # 0A: LISTEN
                    continue
                host, port = local.split(":")
                # the kernel writes the address as 32-bit words in host (little-endian) order
                raw = b"".join(bytes.fromhex(host[i:i + 8])[::-1] for i in range(0, len(host), 8))
                found.append(f"{ipaddress.ip_address(raw)}:{int(port, 16)}")
    return found


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_staying_workers(worker_script, log, ranks: int = 1, key: str | None = None):
    """Workers as the README's attach section starts them (torchrun ... worker_program.py --control ... --stay), on
    loopback, with `key` (default: a new one), once they answer; returns (torchrun process, address, key).
    Stop them with stop_workers."""
    import subprocess
    import sys
    import time

    from tpu_diffusers_runtime.distributed import channel

    key, address = key or channel.new_key(), f"127.0.0.1:{free_port()}"
    process = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone",
                                f"--nproc_per_node={ranks}", str(worker_script), "--control", address, "--stay"],
                               env={**os.environ, channel.KEY_ENV: key}, stdout=open(log, "w"),
                               stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 180
    while True:
        try:
            channel.connect(address, key, timeout=5).close()
            return process, address, key
        except ConnectionError:
            assert process.poll() is None and time.monotonic() < deadline, open(log).read()
            time.sleep(0.5)


def stop_workers(process) -> None:
    import signal

    os.killpg(process.pid, signal.SIGTERM)
    process.wait(30)


def other_version_checkout(pack, folder, pack_version: str):
    """A copy of this checkout that speaks the next protocol and calls itself `pack_version` (workers
    started from another checkout); returns its worker_program.py."""
    import shutil

    from tpu_diffusers_runtime.distributed import protocol

    shutil.copytree(pack, folder, ignore=shutil.ignore_patterns(".venv", ".comfyui", ".git", "tests", "docs",
                                                                 "wheels", "__pycache__"))
    protocol_file = folder / "runtime" / "distributed" / "protocol.py"
    protocol_file.write_text(protocol_file.read_text().replace(
        f"PROTOCOL_VERSION = {protocol.PROTOCOL_VERSION}", f"PROTOCOL_VERSION = {protocol.PROTOCOL_VERSION + 1}"))
    pyproject = folder / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace(f'version = "{protocol.PACK_VERSION}"',
                                                       f'version = "{pack_version}"'))
    return folder / "runtime" / "worker_program.py"
