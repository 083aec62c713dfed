#!/usr/bin/env python3
"""One rank of a worker group (one chip each; a single-chip workflow on a TPU is a group of one).
torchrun starts one per chip (ComfyUI starts torchrun through launcher.py):

    torchrun --nproc_per_node=N [--nnodes=H --node_rank=K --master_addr=A --master_port=P] \\
        runtime/worker_program.py --control HOST:PORT [--stay] [--port-file FILE]

Rank 0 serves the control channel on HOST:PORT (port 0: a free one, written to FILE) with the key in
$TPU_DIFFUSERS_CONTROL_KEY (a new one is made and printed when it is unset), reads commands, and
broadcasts each to every rank; all ranks run it in step (collectives inside the sharded modules),
rank 0 answers. Without --stay the group exits when its client disconnects; with --stay (attach
mode) it waits for the next client. Every rank ends when its torchrun is gone (lifeline.py).
A request that fails on every rank (a bad size, a model that does not load, a compile error)
is answered with an error reply and the group stays up. A rank that fails alone ends its
process; torchrun then stops the group and reports the failing rank, which the ComfyUI side
reads back.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import ipaddress
import os
import socket
import sys
import time

# Run as a script by torchrun: load the runtime under its one import name (runtime_package.py, in the
# pack's folder; the pack itself imports ComfyUI, which a worker does not have).
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import runtime_package  # noqa: E402

runtime_package.load()
from tpu_diffusers_runtime.distributed import lifeline  # noqa: E402

# First of all: this rank ends when its launcher (torchrun) is gone, whatever it is doing then.
lifeline.watch(int(os.environ.get(lifeline.LAUNCHER_PID_ENV) or os.getppid()), lifeline.kill_self, "worker rank")
from tpu_diffusers_runtime import device as device_module  # noqa: E402  (also sets TPU env hygiene first)
from tpu_diffusers_runtime import process_env  # noqa: E402

process_env.apply(process_env.default_root())  # before torch: TorchTPU reads these once, at backend start
from tpu_diffusers_runtime import settings  # noqa: E402
from tpu_diffusers_runtime.distributed import channel, protocol  # noqa: E402

IDLE_TIMEOUT = datetime.timedelta(days=30)  # ranks wait in a collective between prompts
# How long a failed rank waits for the others to report their outcome. A failure shared by every rank
# happens at the same point of the same program, so they arrive together; a rank that fails alone
# leaves its peers stuck in a collective, and after this wait it exits so torchrun stops the group.
AGREE_TIMEOUT = datetime.timedelta(seconds=30)
POLL_SECONDS = 0.05  # rank 0's pace reading the other replicas' steps once its own slice is done


class Cancelled(Exception):
    """The client pressed Cancel; every rank stops at the same step."""


class ControlServer:
    """Rank 0's end of the control channel: accept a client, read commands, answer.

    Nothing a peer sends can stop the group: a peer that fails the handshake (wrong key, silence,
    garbage, a port probe) is logged and dropped; an unusable message from an authenticated client
    gets an error reply; a client of another protocol version is refused by name."""

    def __init__(self, address: str, key: str, stay: bool, world_size: int, device_type: str):
        self.listener = channel.listen(address)
        self.key, self.stay = key, stay
        self.world_size, self.device_type = world_size, device_type
        self.conn: channel.Channel | None = None
        self.had_client = False

    @property
    def address(self) -> str:
        host, port = self.listener.getsockname()[:2]
        return f"{host}:{port}"

    def next_command(self) -> dict:
        """The next command for every rank (with its payloads under "payloads")."""
        while True:
            if self.conn is None:
                if self.had_client and not self.stay:
                    return {"op": "shutdown"}
                self.conn = self._accept()
                continue
            try:
                message, payloads = self.conn.receive()
            except protocol.MessageRefused as e:
                self.send({"op": "error", "kind": "WorkerRequestError", "message": f"the workers refused a message: {e}"})
                continue
            except (EOFError, OSError):
                self.drop()
                continue
            if message["op"] == "hello":
                self._hello(message)
                continue
            # bytes, not views: the command is broadcast to every rank
            return {**message, "payloads": [bytes(p) for p in payloads]}

    def _accept(self) -> channel.Channel | None:
        try:
            conn = channel.accept(self.listener, self.key)
        except channel.AuthenticationError:
            log_refusal("a client with a wrong key")
        except (EOFError, ConnectionError):
            log_refusal("a client that closed the connection during the handshake (a port probe?)")
        except (BlockingIOError, TimeoutError):  # the kernel's receive timeout: a silent peer
            log_refusal(f"a client that did not complete the handshake within {channel.HANDSHAKE_SECONDS:.0f}s")
        except OSError as e:
            log_refusal(f"a client whose handshake failed ({e})")
        else:
            self.had_client = True
            return conn
        return None

    def _hello(self, message: dict) -> None:
        problem = protocol.mismatch(message, f"ComfyUI's pack at {self.conn.peer}", "these workers")
        if problem:
            log_refusal(problem)
            self.send(protocol.refusal(problem, self.world_size, self.device_type))
            self.drop()
        else:
            self.send(protocol.hello_reply(self.world_size, self.device_type))

    def send(self, message: dict, payloads: list[bytes] = ()) -> None:
        if self.conn is None:
            return
        try:
            self.conn.send(message, payloads)
        except OSError:  # the client went away mid-run: stop the run (cancel_requested) and wait for another
            self.drop()

    def drop(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def cancel_requested(self) -> bool:
        try:
            while self.conn is not None and (received := self.conn.receive(timeout=0)) is not None:
                if received[0].get("op") == "cancel":
                    return True
        except protocol.MessageRefused as e:
            log_refusal(f"an unusable message during a run ({e})")
        except (EOFError, OSError):
            self.drop()
        return self.conn is None


def log_refusal(what: str) -> None:
    print(f"[worker] refused {what}", file=sys.stderr, flush=True)


@dataclasses.dataclass
class Run:
    """One generate command as this rank sees it. Replicas work at their own pace, so they share
    step counts and the cancel decision through the group's store, not through collectives
    (a replica with fewer images, or none, makes fewer progress calls); within a replica the
    ranks (TP or CP) stay in step and its first rank's decision is broadcast to the others."""

    prefix: str  # store keys of this run
    replicas: int
    leader: int  # global rank of this replica's first rank
    control_group: object  # a gloo group of this replica's ranks (its TP or CP ranks), for control data
    replica_size: int
    calls: int  # pipeline calls of this replica's slice
    group_calls: int  # pipeline calls of all replicas together
    steps: int = 0  # sampling steps this rank ran (as the pipeline counts them)
    group_steps: int = 0  # rank 0: sampling steps of all replicas together, once its pipeline has said

    def done_key(self, replica: int) -> str:
        """Set by a replica's first rank when its slice has ended (run, cancelled or failed)."""
        return f"{self.prefix}done{replica}"


class RankWorker:
    """Runs commands on one rank with the ordinary Engine, whose loader shards over its replica's TP mesh
    (or applies context parallelism over its CP ranks)."""

    def __init__(self, server: ControlServer | None, device_type: str, store, gather_group):
        from tpu_diffusers_runtime.distributed.sharding import Sharding
        from tpu_diffusers_runtime.engine import Engine
        from tpu_diffusers_runtime.loading import load_pipeline
        from tpu_diffusers_runtime.pipeline_cache import PipelineCache
        from tpu_diffusers_runtime.plan import family_of

        self.server, self.device_type, self.store, self.gather_group = server, device_type, store, gather_group
        self.meshes = {}  # (replicas, cp, tp) -> (DeviceMesh ("dp", "ring", "ulysses", "tp"), control group)
        self.runs = 0
        self.run_state: Run | None = None

        def sharded_loader(handle, device, on_progress, notes):
            """At tp 1 a replica loads as one process would (placement, offload and LoRAs as asked, and its
            denoisers context parallel when the replica has CP ranks: context_parallel_mesh)."""
            tp_mesh = self.device_mesh(handle.mesh)[0]["tp"]
            if tp_mesh.size() == 1:
                return load_pipeline(handle, device, on_progress, notes=notes)
            sharding = Sharding(handle.mesh, tp_mesh, family_of(handle))
            return load_pipeline(handle, device, on_progress, sharding=sharding, notes=notes)

        def context_parallel_mesh(handle):
            """The replica's ("ring", "ulysses") mesh its CP ranks split the denoisers' tokens over; None without."""
            cp_mesh = self.device_mesh(handle.mesh)[0]["ring", "ulysses"]
            return cp_mesh if cp_mesh.size() > 1 else None

        self.engine = Engine(PipelineCache(loader=sharded_loader, context_parallel=context_parallel_mesh),
                             distribute=False)

    def device_mesh(self, spec):
        """The mesh for a spec's shape and this rank's replica control group, made once (every rank makes them
        at the same command). Ring is 1: context parallelism is Ulysses (apply_context_parallel). The control
        group is gloo, apart from the mesh's device groups (tpu_dist on a TPU), so the host decisions sent over
        it (cancel, at every step) never sit between the device collectives of a replica's ranks."""
        import torch
        import torch.distributed as dist
        from torch.distributed.device_mesh import DeviceMesh

        from tpu_diffusers_runtime.distributed.mesh import mesh_shape

        shape = mesh_shape(spec, dist.get_world_size())
        if shape not in self.meshes:
            replicas, cp, tp = shape
            ranks = torch.arange(dist.get_world_size()).reshape(replicas, 1, cp, tp)
            mesh = DeviceMesh(self.device_type, ranks, mesh_dim_names=("dp", "ring", "ulysses", "tp"))
            control_group, _ = dist.new_subgroups_by_enumeration(ranks.reshape(replicas, cp * tp).tolist(),
                                                                 timeout=IDLE_TIMEOUT, backend="gloo")
            self.meshes[shape] = mesh, control_group
        return self.meshes[shape]

    def progress(self, done: int, total: int, what: str, preview=None) -> None:
        """Called on every rank of a replica at the same points; the replica's first rank counts its
        sampling steps, rank 0 reports them for the whole group (with its step's preview image, when
        previews are on), and every rank learns of a cancel."""
        import torch.distributed as dist

        run = self.run_state
        decision = [False]
        if what == "sampling":
            run.steps += 1
        if dist.get_rank() == run.leader:
            if what == "sampling":
                self.store.add(run.prefix + "steps", 1)
            if self.server:
                self.report(done, total, what, preview)
            decision = [self.store.check([run.prefix + "cancel"])]
        if run.replica_size > 1:
            dist.broadcast_object_list(decision, src=run.leader, group=run.control_group)
        if decision[0]:
            raise Cancelled

    def report(self, done: int, total: int, what: str, preview=None) -> None:
        """Rank 0: send progress (sampling counted over every replica, with rank 0's preview image) and
        pass a Cancel on to all. Every call of every replica runs as many steps as rank 0's pipeline says its
        own calls run (the calls differ only in images and seeds)."""
        run = self.run_state
        if what == "sampling":
            run.group_steps = total // run.calls * run.group_calls
            done, total = self.store.add(run.prefix + "steps", 0), run.group_steps
        message, payloads = {"op": "progress", "done": done, "total": total, "what": what}, []
        if preview is not None:
            message["preview_shape"], payloads = list(preview.shape), [preview.tobytes()]
        self.server.send(message, payloads)
        self.pass_on_cancel()

    def pass_on_cancel(self) -> None:
        if self.server.cancel_requested():
            self.store.set(self.run_state.prefix + "cancel", "1")

    def wait_for_replicas(self) -> None:
        """Rank 0, its own slice done: keep reporting the other replicas' steps until the first rank of each
        has said its slice ended (a step count is never what ends the wait, so no miscount can hang it)."""
        run = self.run_state
        done_keys = [run.done_key(replica) for replica in range(run.replicas)]
        reported = None
        while True:
            finished = self.store.check(done_keys)
            steps = self.store.add(run.prefix + "steps", 0)
            if steps != reported:
                self.server.send({"op": "progress", "done": steps, "total": run.group_steps, "what": "sampling"})
                reported = steps
            if finished:
                return
            self.pass_on_cancel()
            if self.store.check([run.prefix + "cancel"]):
                raise Cancelled
            time.sleep(POLL_SECONDS)

    def run(self, command: dict) -> tuple[dict, list[bytes]] | None:
        """Run one command on this rank; returns the reply rank 0 sends (None on other ranks, or none due)."""
        op = command["op"]
        if op == "generate":
            return self.generate(command)
        if op == "unload":
            return {"op": "unloaded", "count": self.engine.unload()}, []
        if op == "cancel":
            return None  # it came after the run it was meant for had ended
        raise ValueError(f"unknown command '{op}'")

    def generate(self, command: dict):
        """Run this replica's contiguous slice of the batch (image i keeps seed + i); rank 0 gathers
        every replica's images from its first rank, in order, and answers for the group."""
        import numpy as np
        import torch.distributed as dist

        from tpu_diffusers_runtime.distributed.mesh import latent_tokens, split_batch
        from tpu_diffusers_runtime.device import resolve_device
        from tpu_diffusers_runtime.distributed.sharding import context_parallel_degree, local_bytes, sharded_fraction
        from tpu_diffusers_runtime.preview import PreviewSpec
        from tpu_diffusers_runtime.handle import PipelineHandle
        from tpu_diffusers_runtime.local_run import denoisers
        from tpu_diffusers_runtime.plan import Plan
        from tpu_diffusers_runtime.tasks import SampleRequest

        # the group's ranks are the mesh (chips 0 asks for all of them): its layout, and the load key, follow them
        handle = PipelineHandle.from_wire(command["handle"])
        handle = handle.replace(mesh=dataclasses.replace(handle.mesh, chips=dist.get_world_size()))
        # Only rank 0 sends previews, so only rank 0 makes them (of its own replica's first image).
        preview = PreviewSpec.from_wire(command["preview"]) if command["preview"] and self.server else None
        # the client's plan: checked there, so every rank, even one with no image, runs what it planned
        plan = Plan.from_wire(command["plan"], SampleRequest.from_wire(command["request"], command["payloads"]),
                              resolve_device(handle.device))
        request, task = plan.request, plan.task
        mesh, control_group = self.device_mesh(handle.mesh)
        replicas, _, cp, tp = mesh.mesh.shape
        replica = mesh.get_local_rank("dp")
        slices = split_batch(request.batch_size, replicas)
        start, count = slices[replica]
        self.runs += 1
        self.run_state = run = Run(prefix=f"run{self.runs}/", replicas=replicas,
                                   leader=replica * cp * tp, control_group=control_group, replica_size=cp * tp,
                                   calls=task.call_count(request.batch_slice(start, count)),
                                   group_calls=sum(task.call_count(request.batch_slice(first, n))
                                                   for first, n in slices))
        mine = {"rank": dist.get_rank(), "replica": replica, "pid": os.getpid(), "cancelled": False}
        tokens = latent_tokens(plan.family, request.width, request.height, request.frames, plan.pipeline.keyframes)
        try:
            try:
                if count:
                    generation = self.engine.run(handle, plan.for_batch_slice(start, count),
                                                 on_progress=self.progress, preview=preview)
                    mine["info"] = generation.info.as_dict()
                    if dist.get_rank() == run.leader:  # the replica's other ranks made the same images
                        mine["images"] = np.ascontiguousarray(generation.images.numpy())
                        if generation.latent is not None:
                            mine["latent"] = np.ascontiguousarray(generation.latent["samples"].numpy())
                        if generation.mask is not None:
                            mine["mask"] = np.ascontiguousarray(generation.mask.numpy())
                        if generation.audio is not None:
                            mine["audio"] = np.ascontiguousarray(generation.audio["waveform"].numpy())
                            mine["sample_rate"] = generation.audio["sample_rate"]
            finally:
                if dist.get_rank() == run.leader:
                    self.store.set(run.done_key(replica), "1")
            if self.server:
                self.wait_for_replicas()
            loaded = denoisers(self.engine.realise(handle, self.progress)[0].pipe, plan.family)  # A14B: both experts
            mine.update(bytes=sum(map(local_bytes, loaded)), fraction=sharded_fraction(*loaded),
                        tokens=tokens // context_parallel_degree(loaded[0]))  # as the loaded model is split
        except Cancelled:
            mine["cancelled"] = True
        mine["steps"] = run.steps
        if dist.get_world_size() == 1:
            gathered = [mine]  # a single-chip group: nothing to gather (and no copy of the images)
        else:  # every rank takes part, cancelled or not, so no replica waits here for one that left
            gathered = [None] * dist.get_world_size() if self.server else None
            dist.gather_object(mine, gathered, dst=0, group=self.gather_group)
        if not self.server:
            return None
        for key in ("steps", "cancel", *(f"done{r}" for r in range(replicas))):  # a long-lived group must not
            self.store.delete_key(run.prefix + key)  # keep every run's keys
        if any(entry["cancelled"] for entry in gathered):
            raise Cancelled
        return self.result(gathered, slices, cp, tp)

    @staticmethod
    def result(gathered: list[dict], slices: list[tuple[int, int]], cp: int, tp: int):
        """Rank 0's reply: the images (and their LATENT and MASK, and a video's sound track, for a family that has
        them) in batch order, and run info for the whole mesh (each entry's "steps": the denoising steps its rank
        ran, every pipeline call's). A replica's ranks (TP or CP) all make its whole images; only its first rank
        sends them."""
        import numpy as np

        leaders = gathered[::cp * tp]  # one entry per replica, in replica order
        ran = [entry for entry in leaders if "images" in entry]
        images, latent, mask, audio = (ran[0].get(name) if len(ran) == 1 else
                                       None if name not in ran[0] else np.concatenate([entry[name] for entry in ran])
                                       for name in ("images", "latent", "mask", "audio"))
        counts = [count for _, count in slices]
        seconds, compiles = ([entry["info"][name] if "info" in entry else 0.0 for entry in leaders]
                             for name in ("sample_seconds", "compile_seconds"))
        info = dict(ran[0]["info"])
        parallel = f"{cp}-way context parallel" if cp > 1 else f"{tp}-way TP"
        notes = [f"data parallel: {len(counts)} replica(s) x {parallel}, images per replica {counts}"
                 if len(gathered) > 1 else f"ran in a worker process (pid {gathered[0]['pid']})"]
        if len(set(counts)) > 1:
            notes.append("uneven split: the first replicas take one image more (no padding)")
        if 0 in counts:
            notes.append(f"replicas {[i for i, n in enumerate(counts) if not n]} had no image: the batch is "
                         "smaller than the replicas")
        info.update(world_size=len(gathered), mesh_shape=(len(counts), cp, tp), sample_seconds=max(seconds),
                    context_parallel=cp, tokens_per_rank=[entry["tokens"] for entry in gathered],
                    image_bytes_per_rank=[entry["images"].nbytes if "images" in entry else 0 for entry in gathered],
                    compiled_now=info["compiled_now"] if info["compiled_now"] is None
                    else any(entry["info"]["compiled_now"] for entry in ran),
                    transformer_bytes_per_rank=[entry["bytes"] for entry in gathered],
                    sharded_fraction_per_rank=[entry["fraction"] for entry in gathered],
                    rank_pids=[entry["pid"] for entry in gathered], replica_images=counts,
                    replica_sample_seconds=seconds,
                    replica_step_seconds=[s / max(entry["steps"], 1) for s, entry in zip(seconds, leaders)],
                    replica_compile_seconds=compiles,
                    replica_ranks=[[entry["rank"] for entry in gathered if entry["replica"] == r]
                                   for r in range(len(counts))],
                    notes=[*notes, *info["notes"]])
        arrays = [array for array in (images, latent, mask, audio) if array is not None]
        return ({"op": "result", "info": info, "shape": list(images.shape),
                 **{f"{name}_shape": None if array is None else list(array.shape)
                    for name, array in (("latent", latent), ("mask", mask), ("audio", audio))},
                 "sample_rate": ran[0].get("sample_rate", 0)},
                [memoryview(array).cast("B") for array in arrays])


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
        reply = {"op": "cancelled"}, []
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
        return {"op": "error", "kind": kind, "message": message}, []
    if failure is not None:
        raise failure
    if any(outcomes):
        return None  # a peer failed alone: it exits, and torchrun stops the group
    return reply


def is_loopback(host: str) -> bool:
    """Whether `host` is a loopback IP address as written (a host name is not resolved: Debian maps the
    host's own name to 127.0.1.1, while the other hosts of a slice reach it at its network address)."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def hosted_store(host: str, port: int, world: int, timeout: datetime.timedelta | None = None):
    """A TCPStore this rank serves at host:port (port 0: a free one). TCPStore itself listens on every
    interface whatever host it is given; for a group on one host (MASTER_ADDR a loopback address, as
    ComfyUI's local launch sets it) this one listens on loopback only."""
    import torch.distributed as dist

    options = dict(is_master=True, wait_for_workers=False, **({"timeout": timeout} if timeout else {}))
    if not is_loopback(host):
        return dist.TCPStore(host, port, world, **options)
    listener = socket.create_server((host, port))
    return dist.TCPStore(host, listener.getsockname()[1], world, master_listen_fd=listener.detach(), **options)


def init_process_group(backend: str) -> None:
    """Join the group. Under torchrun's shared store (TORCHELASTIC_USE_AGENT_STORE) every rank is its
    client, as torch does; otherwise (ComfyUI's local launch) rank 0 serves it, on loopback."""
    import torch.distributed as dist

    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        dist.init_process_group(backend=backend, timeout=IDLE_TIMEOUT)
        return
    host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    store = hosted_store(host, port, world, IDLE_TIMEOUT) if rank == 0 else \
        dist.TCPStore(host, port, world, is_master=False, timeout=IDLE_TIMEOUT)
    dist.init_process_group(backend=backend, store=store, rank=rank, world_size=world, timeout=IDLE_TIMEOUT)


def group_store(rank: int, world: int):
    """A key-value store of the group's own, served by rank 0 where torchrun's master is, for what
    replicas share without waiting for each other (step counts, the cancel decision)."""
    import torch.distributed as dist

    host = os.environ["MASTER_ADDR"]
    port = [None]
    store = hosted_store(host, 0, world) if rank == 0 else None
    if store is not None:
        port = [store.port]
    dist.broadcast_object_list(port, src=0)
    return store or dist.TCPStore(host, port[0], world, is_master=False)


def write_port_file(path: str, port: int) -> None:
    """Whole or not at all: the launching side polls for the file and reads it once it exists."""
    with open(path + ".tmp", "w") as f:
        f.write(str(port))
    os.replace(path + ".tmp", path)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--control", required=True, help="host:port where rank 0 serves the control channel")
    parser.add_argument("--stay", action="store_true", help="keep running when the client disconnects (attach)")
    parser.add_argument("--port-file", help="where rank 0 writes the port it bound (for --control HOST:0)")
    args = parser.parse_args(argv)

    import torch
    import torch.distributed as dist

    info = device_module.detect_device()
    if info.type == "cpu":
        from tpu_diffusers_runtime.distributed.cpu_mesh import enable_cpu_tensor_parallel

        enable_cpu_tensor_parallel()
    elif info.type == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    init_process_group(info.process_group_backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    outcome_group = dist.new_group(backend="gloo", timeout=AGREE_TIMEOUT)
    gather_group = dist.new_group(backend="gloo", timeout=IDLE_TIMEOUT)  # images wait for the slowest replica
    store = group_store(rank, world)

    server = None
    if rank == 0:
        configured_key = settings.get(channel.KEY_ENV)
        key = configured_key or channel.new_key()
        server = ControlServer(args.control, key, stay=args.stay, world_size=world, device_type=info.type)
        if args.port_file:
            write_port_file(args.port_file, server.listener.getsockname()[1])
        shown_key = "from $" + channel.KEY_ENV if configured_key else key
        print(f"[worker] {world} rank(s) on {info.type}; control channel on {server.address}, key {shown_key}; "
              f"protocol {protocol.PROTOCOL_VERSION}, pack {protocol.PACK_VERSION}", flush=True)
    worker = RankWorker(server, info.type, store, gather_group)
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
