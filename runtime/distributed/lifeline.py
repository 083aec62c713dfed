"""Worker processes end when the process that started them is gone, in every phase.

A locally launched group is ComfyUI -> launcher (torchrun, in launcher.py) -> one process per rank.
SIGKILL gives no process a chance to clean up, and torchrun starts each rank in a session of its
own, so no signal reaches the ranks when ComfyUI dies. Instead each process watches its own parent:
once it is re-parented (its parent exited, whichever way), it ends itself. Watching the parent pid
through getppid() cannot be fooled by a recycled pid: a process's parent changes exactly once, when
the parent dies. Torch-free, started before the heavy imports.
"""

from __future__ import annotations

import os
import signal
import sys
import threading

POLL_SECONDS = 0.5
LAUNCHER_PID_ENV = "TPU_DIFFUSERS_LAUNCHER_PID"  # set by launcher.py for its ranks: the parent they must keep


def watch(parent: int, on_gone, what: str) -> None:
    """Call `on_gone()` (from a daemon thread) as soon as this process's parent is no longer `parent`."""
    def check() -> None:
        while os.getppid() == parent:
            threading.Event().wait(POLL_SECONDS)
        print(f"[worker] {what}: the process that started it ({parent}) is gone; ending", file=sys.stderr, flush=True)
        on_gone()

    if os.getppid() != parent:  # gone already, before this process got this far
        check()
    threading.Thread(target=check, name="tpu-diffusers-lifeline", daemon=True).start()


def kill_self() -> None:
    """A rank ends at once: it may be inside a collective or a device call that would never return."""
    os.kill(os.getpid(), signal.SIGKILL)


def terminate_self() -> None:
    """The launcher ends through torchrun's own SIGTERM handling, which stops its ranks first."""
    os.kill(os.getpid(), signal.SIGTERM)
