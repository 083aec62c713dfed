#!/usr/bin/env python3
"""One rank of a tensor-parallel worker group. torchrun starts one per chip:

    torchrun --nproc_per_node=N [--nnodes=H --node_rank=K --master_addr=A --master_port=P] \\
        runtime/distributed/worker.py --control HOST:PORT [--stay]

Rank 0 serves the control channel on HOST:PORT with the key in $TPU_DIFFUSERS_CONTROL_KEY
(a new one is made and printed when it is unset), reads commands, and broadcasts each to every
rank; all ranks run it in step (collectives inside the sharded modules), rank 0 answers.
Without --stay the group exits when its client disconnects (a local launch dies with its
ComfyUI); with --stay (attach mode) it waits for the next client.
A request that fails on every rank (a bad size, a model that does not load, a compile error)
is answered with an error reply and the group stays up. A rank that fails alone ends its
process; torchrun then stops the group and reports the failing rank, which the ComfyUI side
reads back.
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
from runtime import process_env  # noqa: E402

process_env.apply(process_env.default_root())  # before torch: TorchTPU reads these once, at backend start
from runtime import settings  # noqa: E402
from runtime.distributed import channel  # noqa: E402

IDLE_TIMEOUT = datetime.timedelta(days=30)  # ranks wait in a collective between prompts
# How long a failed rank waits for the others to report their outcome. A failure shared by every rank
# happens at the same point of the same program, so they arrive together; a rank that fails alone
# leaves its peers stuck in a collective, and after this wait it exits so torchrun stops the group.
AGREE_TIMEOUT = datetime.timedelta(seconds=30)


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

    def __init__(self, mesh, server: ControlServer | None, device_type: str):
        from runtime.distributed.sharding import Sharding
        from runtime.engine import Engine
        from runtime.loading import PipelineCache, load_pipeline

        self.server, self.device_type = server, device_type

        def sharded_loader(handle, device, on_progress):
            return load_pipeline(handle, device, on_progress, sharding=Sharding(handle.mesh, mesh))

        self.engine = Engine(PipelineCache(loader=sharded_loader), distribute=False)

    def progress(self, done: int, total: int, what: str, preview=None) -> None:
        """Called on every rank at the same points; rank 0 reports (with the step's preview image, when
        previews are on) and decides whether to stop."""
        import torch.distributed as dist

        decision = [False]
        if self.server:
            message, payload = {"op": "progress", "done": done, "total": total, "what": what}, None
            if preview is not None:
                message["preview_shape"], payload = list(preview.shape), preview.tobytes()
            self.server.send(message, payload)
            decision = [self.server.cancel_requested()]
        dist.broadcast_object_list(decision, src=0)
        if decision[0]:
            raise Cancelled

    def run(self, command: dict) -> tuple[dict, bytes | None] | None:
        """Run one command on this rank; returns the reply rank 0 sends (None on other ranks, or none due)."""
        import torch.distributed as dist

        op = command["op"]
        if op == "generate":
            return self.generate(command)
        if op == "unload":
            return {"op": "unloaded", "count": self.engine.unload()}, None
        if op == "hello":
            return {"op": "hello", "world_size": dist.get_world_size(), "device": self.device_type}, None
        if op == "cancel":
            return None  # it came after the run it was meant for had ended
        raise ValueError(f"unknown command '{op}'")

    def generate(self, command: dict):
        import numpy as np
        import torch.distributed as dist

        from runtime.distributed.sharding import local_bytes, sharded_fraction
        from runtime.handle import PipelineHandle
        from runtime.preview import PreviewSpec
        from runtime.sampling import SampleRequest

        handle = PipelineHandle.from_wire(command["handle"])
        # Only rank 0 sends previews, so only rank 0 makes them (the latents are the same on every rank).
        preview = PreviewSpec.from_wire(command["preview"]) if command["preview"] and self.server else None
        generation = self.engine.generate(handle, SampleRequest(**command["request"]), on_progress=self.progress,
                                          preview=preview)
        entry = self.engine.realise(handle)[0]
        per_rank = [None] * dist.get_world_size()
        transformer = entry.pipe.transformer
        dist.all_gather_object(per_rank, (local_bytes(transformer), sharded_fraction(transformer), os.getpid()))
        if not self.server:
            return None
        images = np.ascontiguousarray(generation.images.numpy())
        sizes, fractions, pids = zip(*per_rank)
        info = {**generation.info.as_dict(), "world_size": dist.get_world_size(),
                "transformer_bytes_per_rank": sizes, "sharded_fraction_per_rank": fractions,
                "rank_pids": pids}
        return {"op": "result", "info": info, "shape": list(images.shape)}, images.tobytes()


def run_on_every_rank(worker: RankWorker, command: dict, outcome_group) -> tuple[dict, bytes | None] | None:
    """Run a command on this rank, then agree with the other ranks on how it went; returns rank 0's reply.

    The outcomes are exchanged over `outcome_group`, a gloo group of its own with a short timeout, so a
    peer stuck in the main group's collectives cannot mix with the exchange or stall it for long.
    Every rank failed: the ranks are still in step, so the error becomes the reply. Some failed: a
    failed rank re-raises (its process ends, torchrun stops the group and reports it); the others
    answer nothing and are stopped by torchrun.
    """
    import torch.distributed as dist

    failure = None
    try:
        reply = worker.run(command)
    except Cancelled:
        reply = {"op": "cancelled"}, None
    except Exception as e:
        failure, reply = e, None
    outcomes = [None] * dist.get_world_size()
    try:
        dist.all_gather_object(outcomes, failure and (type(failure).__name__, str(failure)), group=outcome_group)
    except RuntimeError:  # a peer is gone, or did not come within AGREE_TIMEOUT
        if failure is not None:
            raise failure from None
        raise
    if all(outcomes):
        kind, message = outcomes[0]
        return {"op": "error", "kind": kind, "message": message}, None
    if failure is not None:
        raise failure
    if any(outcomes):
        return None  # a peer failed alone: it exits, and torchrun stops the group
    return reply


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

    outcome_group = dist.new_group(backend="gloo", timeout=AGREE_TIMEOUT)

    server = None
    if rank == 0:
        configured_key = settings.get(channel.KEY_ENV)
        key = configured_key or channel.new_key()
        server = ControlServer(args.control, key, stay=args.stay)
        shown_key = "from $" + channel.KEY_ENV if configured_key else key
        print(f"[worker] {world} rank(s) on {info.type}; control channel on {args.control}, key {shown_key}",
              flush=True)
    worker = RankWorker(mesh, server, info.type)
    while True:
        command = [server.next_command() if server else None]
        dist.broadcast_object_list(command, src=0)
        if command[0]["op"] == "shutdown":
            break
        reply = run_on_every_rank(worker, command[0], outcome_group)
        if server and reply:
            server.send(*reply)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    from torch.distributed.elastic.multiprocessing.errors import record

    sys.exit(record(main)())
