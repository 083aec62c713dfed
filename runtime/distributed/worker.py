#!/usr/bin/env python3
"""One rank of a tensor-parallel worker group. torchrun starts one per chip:

    torchrun --nproc_per_node=N [--nnodes=H --node_rank=K --master_addr=A --master_port=P] \\
        runtime/distributed/worker.py --control HOST:PORT [--stay]

Rank 0 serves the control channel on HOST:PORT with the key in $TPU_DIFFUSERS_CONTROL_KEY
(a new one is made and printed when it is unset), reads commands, and broadcasts each to every
rank; all ranks run it in step (collectives inside the sharded modules), rank 0 answers.
Without --stay the group exits when its client disconnects (a local launch dies with its
ComfyUI); with --stay (attach mode) it waits for the next client.
An exception on any rank ends that process; torchrun then stops the group and reports the
failing rank, which the ComfyUI side reads back.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys

# Run as a script by torchrun: make the pack's runtime importable as a top-level package
# (the pack itself imports ComfyUI, which a worker does not have).
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from runtime import device as device_module  # noqa: E402  (also sets TPU env hygiene first)
from runtime.distributed import channel  # noqa: E402

IDLE_TIMEOUT = datetime.timedelta(days=30)  # ranks wait in a collective between prompts


class Cancelled(Exception):
    """The client pressed Cancel; every rank stops at the same step."""


class ControlServer:
    """Rank 0's end of the control channel: accept a client, read commands, answer."""

    def __init__(self, address: str, key: str, stay: bool):
        self.listener = channel.listen(address, key)
        self.stay = stay
        self.conn = None
        self.had_client = False

    def next_command(self) -> dict:
        while True:
            if self.conn is None:
                if self.had_client and not self.stay:
                    return {"op": "shutdown"}
                try:
                    self.conn = self.listener.accept()
                    self.had_client = True
                except (channel.AuthenticationError, OSError) as e:
                    print(f"[worker] refused a client: {e}", file=sys.stderr, flush=True)
                    continue
            try:
                message, _ = channel.receive(self.conn)
                return message
            except (EOFError, OSError):
                self.conn = None

    def send(self, message: dict, payload: bytes | None = None) -> None:
        if self.conn is None:
            return
        try:
            channel.send(self.conn, message, payload)
        except OSError:  # the client went away mid-run: stop the run (cancel_requested) and wait for another
            self.conn = None

    def cancel_requested(self) -> bool:
        try:
            while self.conn is not None and self.conn.poll(0):
                message, _ = channel.receive(self.conn)
                if message.get("op") == "cancel":
                    return True
        except (EOFError, OSError):
            self.conn = None
        return self.conn is None


class RankWorker:
    """Runs commands on one rank with the ordinary Engine, whose loader shards by the handle's mesh."""

    def __init__(self, rank: int, mesh, server: ControlServer | None):
        from runtime.distributed.sharding import Sharding
        from runtime.engine import Engine
        from runtime.loading import PipelineCache, load_pipeline

        self.rank, self.mesh, self.server = rank, mesh, server

        def sharded_loader(handle, device, on_progress):
            return load_pipeline(handle, device, on_progress, sharding=Sharding(handle.mesh, mesh))

        self.engine = Engine(PipelineCache(loader=sharded_loader), distribute=False)

    def progress(self, done: int, total: int, what: str) -> None:
        """Called on every rank at the same points; rank 0 reports and decides whether to stop."""
        import torch.distributed as dist

        decision = [False]
        if self.server:
            self.server.send({"op": "progress", "done": done, "total": total, "what": what})
            decision = [self.server.cancel_requested()]
        dist.broadcast_object_list(decision, src=0)
        if decision[0]:
            raise Cancelled

    def generate(self, command: dict):
        import numpy as np
        import torch.distributed as dist

        from runtime.distributed.sharding import local_bytes, sharded_fraction
        from runtime.handle import PipelineHandle
        from runtime.sampling import SampleRequest

        handle = PipelineHandle.from_wire(command["handle"])
        generation = self.engine.generate(handle, SampleRequest(**command["request"]), on_progress=self.progress)
        entry = self.engine.realise(handle)[0]
        per_rank = [None] * dist.get_world_size()
        transformer = entry.pipe.transformer
        dist.all_gather_object(per_rank, (local_bytes(transformer), sharded_fraction(transformer), os.getpid()))
        if self.server:
            images = np.ascontiguousarray(generation.images.numpy())
            sizes, fractions, pids = zip(*per_rank)
            info = {**generation.info.as_dict(), "world_size": dist.get_world_size(),
                    "transformer_bytes_per_rank": sizes, "sharded_fraction_per_rank": fractions,
                    "rank_pids": pids}
            self.server.send({"op": "result", "info": info, "shape": list(images.shape)}, images.tobytes())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--control", required=True, help="host:port where rank 0 serves the control channel")
    parser.add_argument("--stay", action="store_true", help="keep running when the client disconnects (attach)")
    args = parser.parse_args(argv)

    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh

    info = device_module.detect_device()
    if info.type == "cpu":
        from runtime.distributed.cpu_mesh import enable_cpu_tensor_parallel

        enable_cpu_tensor_parallel()
    elif info.type == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend=info.process_group_backend, timeout=IDLE_TIMEOUT)
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = DeviceMesh(info.type, list(range(world)))

    server = None
    if rank == 0:
        key = os.environ.get(channel.KEY_ENV) or channel.new_key()
        server = ControlServer(args.control, key, stay=args.stay)
        shown_key = "from $" + channel.KEY_ENV if os.environ.get(channel.KEY_ENV) else key
        print(f"[worker] {world} rank(s) on {info.type}; control channel on {args.control}, key {shown_key}",
              flush=True)
    worker = RankWorker(rank, mesh, server)
    while True:
        command = [server.next_command() if server else None]
        dist.broadcast_object_list(command, src=0)
        op = command[0]["op"]
        if op == "shutdown":
            break
        try:
            if op == "generate":
                worker.generate(command[0])
            elif op == "unload":
                count = worker.engine.unload()
                if server:
                    server.send({"op": "unloaded", "count": count})
            elif op == "hello" and server:
                server.send({"op": "hello", "world_size": world, "device": info.type})
        except Cancelled:
            if server:
                server.send({"op": "cancelled"})
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    from torch.distributed.elastic.multiprocessing.errors import record

    sys.exit(record(main)())
