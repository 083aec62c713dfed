#!/usr/bin/env python3
"""Starts a local worker group for ComfyUI: torch's own launcher (torchrun) runs in this process.

    launcher.py --parent PID [--tpu] -- <torchrun arguments: --nproc_per_node=N ... worker_program.py ...>

Before torchrun starts the ranks, this process (not ComfyUI's) takes TorchTPU's launch environment
for N ranks (`torch.tpu.distributed.set_tpu_launch_env`, which writes os.environ: here it writes
this process's own), and ties itself to the ComfyUI process `--parent`: when that is gone, torchrun
is told to stop (SIGTERM, its own teardown of the ranks), and each rank watches this process in turn.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import runtime_package  # noqa: E402

runtime_package.load()
from tpu_diffusers_runtime.distributed import lifeline  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parent", type=int, required=True, help="pid of the ComfyUI process that launched us")
    parser.add_argument("--tpu", action="store_true", help="set TorchTPU's launch environment for the ranks")
    parser.add_argument("torchrun", nargs=argparse.REMAINDER, help="-- then torchrun's own arguments")
    args = parser.parse_args(argv)
    lifeline.watch(args.parent, lifeline.terminate_self, "worker launcher")
    torchrun_args = args.torchrun[1:] if args.torchrun[:1] == ["--"] else args.torchrun
    if args.tpu:
        import torch

        ranks = next(int(a.split("=", 1)[1]) for a in torchrun_args if a.startswith("--nproc_per_node="))
        try:
            torch.tpu.distributed.set_tpu_launch_env(nproc_per_node=ranks)
        except RuntimeError as e:
            if ranks != 1:
                raise
            # One rank where TorchTPU knows no one-chip topology (a v7 chip is two devices): the rank
            # then sees the chips as a single process would, as ComfyUI's own process did before.
            print(f"[worker] one rank without TorchTPU's launch environment ({e})", file=sys.stderr, flush=True)
    os.environ[lifeline.LAUNCHER_PID_ENV] = str(os.getpid())
    from torch.distributed.run import main as torchrun

    torchrun(torchrun_args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
