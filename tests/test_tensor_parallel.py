"""Tensor parallelism on a CPU mesh: 2 ranks, gloo, workers launched with torchrun."""

import contextlib
import dataclasses
import ipaddress
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import tiny_loras
from comfy_host import free_port
from processes import alive_after, launched_workers, listening_addresses

from tpu_diffusers_runtime.errors import CompileError
from tpu_diffusers_runtime.specs import CompileSpec
from tpu_diffusers_runtime.device import device_info
from tpu_diffusers_runtime.distributed import channel
from tpu_diffusers_runtime.distributed.group import WORKER_SCRIPT, WorkerGroup, root_cause
from tpu_diffusers_runtime.errors import WorkerGroupError, WorkerRequestError, from_wire
from tpu_diffusers_runtime.distributed.mesh import check_mesh
from tpu_diffusers_runtime.specs import MeshSpec, Workers
from tpu_diffusers_runtime.distributed.sharding import local_bytes
from tpu_diffusers_runtime.engine import Engine
from tpu_diffusers_runtime.errors import ModelLoadError, UserInputError
from tpu_diffusers_runtime.handle import PipelineHandle
from tpu_diffusers_runtime.loading import inspect_source
from tpu_diffusers_runtime.plan import plan_request
from tpu_diffusers_runtime.specs import ExecutionMode, LoraSpec, Placement
from tpu_diffusers_runtime.tasks import SampleRequest

ROOT = Path(__file__).resolve().parent.parent
TP_VS_SINGLE_ATOL = 1e-5  # measured ~4e-7: only the all-reduce order differs


def request(**overrides):
    values = dict(prompt="a cat sitting on a red chair", width=64, height=64, steps=2, guidance=2.0, seed=11)
    return SampleRequest(**{**values, **overrides})


def handle_for(tiny, name, **fields):
    source = tiny(name)
    return PipelineHandle.of(source=source, model_class=inspect_source(source), **fields)




@pytest.fixture
def engine():
    engine = Engine()
    yield engine
    engine.unload()


def test_a_local_group_listens_on_loopback_only(tiny, engine):
    """torchrun's rendezvous, the process group's and the group's stores, gloo and the control channel of a
    group launched on this host: no port of it is open to the network."""
    result = engine.generate(handle_for(tiny, "flux1-schnell", mesh=MeshSpec(chips=2)), request())
    launcher, *ranks = result.info.worker_pids
    listening = {pid: listening_addresses(pid) for pid in (launcher, *ranks)}
    assert len(ranks) == 2 and all(listening[rank] for rank in ranks), listening  # each rank serves gloo at least
    open_to_the_network = {pid: [address for address in addresses
                                 if not ipaddress.ip_address(address.rpartition(":")[0]).is_loopback]
                           for pid, addresses in listening.items()}
    assert not any(open_to_the_network.values()), open_to_the_network


@pytest.mark.parametrize("name", ["flux1-schnell", "flux2", "qwenimage", "flux2-klein", "qwenimage21"])
def test_two_ranks_give_the_single_process_image_and_each_holds_half_the_transformer(tiny, engine, name):
    single_engine = Engine()
    single = single_engine.generate(handle_for(tiny, name), request())
    full_bytes = local_bytes(single_engine.realise(handle_for(tiny, name))[0].pipe.transformer)

    result = engine.generate(handle_for(tiny, name, mesh=MeshSpec(chips=2)), request())
    torch.testing.assert_close(result.images, single.images, atol=TP_VS_SINGLE_ATOL, rtol=0)
    assert (result.mask is None) == (single.mask is None) == (name != "qwenimage21")  # its RGBA's alpha comes back
    if single.mask is not None:
        torch.testing.assert_close(result.mask, single.mask, atol=TP_VS_SINGLE_ATOL, rtol=0)
    per_rank = result.info.transformer_bytes_per_rank
    assert result.info.world_size == 2 and per_rank[0] == per_rank[1]
    assert result.info.image_bytes_per_rank == (result.images.numpy().nbytes, 0)  # rank 1's copy stays there
    # each rank holds half of every sharded weight; what the TP plan leaves whole (embedders, norms,
    # rowwise biases) is on both, a large share of these tiny models and a small one of real ones
    assert result.info.sharded_fraction_per_rank == (0.5, 0.5)
    assert per_rank[0] < 0.8 * full_bytes, (per_rank, full_bytes)

    again = engine.generate(handle_for(tiny, name, mesh=MeshSpec(chips=2)), request(seed=12, steps=3))
    assert result.info.loaded and not again.info.loaded and again.info.load_seconds < result.info.load_seconds
    assert again.info.worker_pids == result.info.worker_pids  # the same warm workers


def test_two_context_parallel_ranks_give_the_single_process_video_of_both_wan_experts(tiny, engine):
    """Wan 2.2 has a CP plan in diffusers: each rank holds the whole pipeline and runs half of the video's latent
    tokens (Ulysses all-to-all on gloo). T2V A14B's 3 steps cross its boundary, so both experts run split; TI2V-5B
    (a timestep per token, split too) reuses the same warm group. Measured: the frames equal one process's exactly
    (max diff 0.0 on CPU); the tolerance only allows for another thread count's sums."""
    for name in ("wan22-t2v-a14b", "wan22-ti2v-5b"):
        video = request(frames=5, steps=3)
        single = Engine(distribute=False).generate(handle_for(tiny, name), video)
        result = engine.generate(handle_for(tiny, name, mesh=MeshSpec(chips=2, context_parallel=2)), video)
        torch.testing.assert_close(result.images, single.images, atol=TP_VS_SINGLE_ATOL, rtol=0)
        assert result.info.frames == 5 and result.images.shape == (5, 64, 64, 3)
        assert result.audio is None and result.info.sample_rate == 0  # no sound: none comes back from the ranks
        assert (result.info.world_size, result.info.context_parallel, result.info.mesh_shape) == (2, 2, (1, 2, 1))
        # both ranks made the video; only the replica's first rank hands it to rank 0
        assert result.info.image_bytes_per_rank == (result.images.numpy().nbytes, 0)
        tokens = 2 * (64 // 16) ** 2 if name == "wan22-t2v-a14b" else 2 * (64 // 32) ** 2  # latent frames x h x w
        assert result.info.tokens_per_rank == (tokens // 2, tokens // 2)
        experts = "transformer over 2 ranks, transformer_2 over 2 ranks" if name == "wan22-t2v-a14b" \
            else "transformer over 2 ranks"
        notes = "\n".join(result.info.notes)
        assert f"context parallel (Ulysses): {experts}\n" in notes + "\n", notes
        assert f"{tokens} latent tokens, {tokens // 2} on each rank" in notes
        assert "mesh: 1 replica(s) x 2 CP; replica 0 ranks [0, 1]" in result.info.summary()


def test_two_context_parallel_ranks_give_the_single_process_video_and_sound_of_ltx2(tiny, engine):
    """LTX-2 with the family's CP plan (diffusers' fails on 2 ranks): the video tokens are split (image to video's
    per-token timestep with them; first/last frame to video's last frame joins them as keyframe tokens), the audio
    tokens and the text stay whole on every rank. Text to video, image to video and first/last frame to video on the
    same warm group: the frames and the sound track equal one process's. Measured on CPU: max diff 6e-7 (frames) and
    6e-8 (sound); with diffusers' plan the ranks fail (a 2-vs-4 size mismatch)."""
    first, last = np.random.default_rng(3).random((2, 1, 32, 64, 3)).astype(np.float32)
    single_engine = Engine(distribute=False)
    for task, images in (("text2video", ()), ("image2video", (first,)), ("firstlast2video", (first, last))):
        # 64x32: the first/last frame's appended keyframe makes (2 + 1) x 1 x 2 tokens, which 2 ranks divide
        video = dataclasses.replace(request(width=64, height=32, frames=9, steps=2), images=images)
        single = single_engine.generate(handle_for(tiny, "ltx2"), video)
        result = engine.generate(handle_for(tiny, "ltx2", mesh=MeshSpec(chips=2, context_parallel=2)), video)
        assert result.info.task == task and result.info.context_parallel == 2
        assert (result.images - single.images).abs().max() <= 1 / 255
        torch.testing.assert_close(result.audio["waveform"], single.audio["waveform"], atol=1e-4, rtol=0)
        assert "context parallel (Ulysses): transformer over 2 ranks" in result.info.notes


@pytest.mark.parametrize("name", ["ltx2", "ltx23"])
def test_two_tensor_parallel_ranks_give_the_single_process_video_and_sound_of_ltx2(tiny, engine, name):
    """LTX-2 and LTX-2.3 with the family's TP plan (diffusers has none): each rank holds a 1/2 slice of every
    attention's value and output projections (per head) and of both FFNs; the frames and the sound track equal one
    process's, and each rank holds half of what the plan shards."""
    video = request(width=32, height=32, frames=9, steps=2)
    single = Engine(distribute=False).generate(handle_for(tiny, name), video)
    # the tiny Gemma has one key/value head, which 2 ranks cannot divide: its text encoder stays whole
    result = engine.generate(handle_for(tiny, name, mesh=MeshSpec(chips=2, shard_text_encoder=False)), video)
    assert (result.images - single.images).abs().max() <= 1 / 255
    torch.testing.assert_close(result.audio["waveform"], single.audio["waveform"], atol=1e-4, rtol=0)
    assert result.info.world_size == 2 and result.info.sharded_fraction_per_rank == (0.5, 0.5)

def test_context_parallel_under_model_cpu_offload_run_after_run_and_across_a_task_switch(tiny, engine):
    """CP under model CPU offload, for each Wan 2.2 model: each rank applies context parallelism before the offload
    hooks, so diffusers' re-arming of them after every run (and their move to the image to video pipeline on a task
    switch) keeps every CP hook, the root one that splits TI2V-5B's per-token timesteps included (diffusers issue
    #12533: applied the other way round, that hook is gone from the second run on). Each run equals one process's
    frames: TI2V-5B text to video twice, image to video on the same loaded pipeline, text to video again; T2V A14B
    twice, then I2V A14B twice (its start image's latents join the noise before the split)."""
    start = (np.random.default_rng(3).random((1, 64, 64, 3))).astype(np.float32)
    offload = dict(placement=Placement.MODEL_CPU_OFFLOAD)
    single_engine = Engine(distribute=False)
    runs = [("wan22-ti2v-5b", (), True), ("wan22-ti2v-5b", (), False), ("wan22-ti2v-5b", (start,), False),
            ("wan22-ti2v-5b", (), False), ("wan22-t2v-a14b", (), True), ("wan22-t2v-a14b", (), False),
            ("wan22-i2v-a14b", (start,), True), ("wan22-i2v-a14b", (start,), False)]
    for seed, (name, images, loads) in enumerate(runs):
        video = dataclasses.replace(request(frames=5, steps=3, seed=seed), images=images)
        single = single_engine.generate(handle_for(tiny, name, **offload), video)
        result = engine.generate(handle_for(tiny, name, mesh=MeshSpec(chips=2, context_parallel=2), **offload), video)
        torch.testing.assert_close(result.images, single.images, atol=TP_VS_SINGLE_ATOL, rtol=0,
                                   msg=lambda text: f"run {seed} ({name}): {text}")
        assert (result.info.loaded, result.info.context_parallel) == (loads, 2)
        assert result.info.task == ("image2video" if images else "text2video")


def test_each_layout_switch_on_the_same_ranks_loads_the_pipeline_for_its_layout(tiny, engine):
    """The ranks' cache keys a pipeline on the layout they run it in, (replicas, cp, tp) as they resolve the mesh,
    and under TP what is sharded: a pipeline sharded for TP, or hooked for CP, never runs in another layout (it
    cannot be laid out again: diffusers' enable_parallelism refuses a second call). Tiny TI2V-5B, 2 videos, on one
    warm group of 2 ranks: TP -> CP -> TP -> CP -> 2 replicas each load, and the run info says so with its layout;
    2 replicas asked for another way (replicas 2 instead of 0) is the same layout and reuses the loaded pipeline."""
    video = request(frames=5, steps=2, batch_size=2)
    single = Engine(distribute=False).generate(handle_for(tiny, "wan22-ti2v-5b"), video)
    tp = MeshSpec(chips=2, replicas=1)
    cp = MeshSpec(chips=2, replicas=1, context_parallel=2)
    switches = [  # (mesh, loaded, mesh_shape (replicas, cp, tp))
        (tp, True, (1, 1, 2)), (cp, True, (1, 2, 1)), (tp, True, (1, 1, 2)),
        (MeshSpec(chips=2, context_parallel=2, shard_transformer=False), True, (1, 2, 1)),
        (MeshSpec(chips=2, shard_transformer=False), True, (2, 1, 1)),  # cp 2 -> cp 1 with replicas
        (MeshSpec(chips=2, replicas=2), False, (2, 1, 1))]
    for mesh, loaded, shape in switches:
        result = engine.generate(handle_for(tiny, "wan22-ti2v-5b", mesh=mesh), video)
        assert (result.info.loaded, result.info.mesh_shape, result.info.context_parallel) == (loaded, shape, shape[1])
        torch.testing.assert_close(result.images, single.images, atol=TP_VS_SINGLE_ATOL, rtol=0,
                                   msg=lambda text: f"{mesh}: {text}")


def test_wan_lora_pair_on_two_context_parallel_ranks_gives_the_single_process_frames(tiny, engine, tmp_path):
    """LoRAs with CP: each CP rank holds the whole pipeline, so lightx2v's high-noise LoRA is fused into its
    `transformer` and the low-noise one into its `transformer_2` as in one process (the CP hooks sit on the blocks,
    the LoRAs change the linears inside them). Without the LoRAs, the same warm group gives the base frames back."""
    model = tiny("wan22-t2v-a14b")
    pair = tuple(LoraSpec(str(tiny_loras.build(model, tmp_path / f"{expert}.safetensors", "lightx2v", seed=seed,
                                               expert=component)), strength, expert)
                 for seed, (expert, component, strength) in enumerate(
                     (("high_noise", "transformer", 1.0), ("low_noise", "transformer_2", 0.7)), start=5))
    video = request(frames=5, steps=3)
    single_engine = Engine(distribute=False)
    base = single_engine.generate(handle_for(tiny, "wan22-t2v-a14b"), video)
    single = single_engine.generate(handle_for(tiny, "wan22-t2v-a14b", loras=pair), video)
    cp = MeshSpec(chips=2, context_parallel=2)
    result = engine.generate(handle_for(tiny, "wan22-t2v-a14b", mesh=cp, loras=pair), video)
    torch.testing.assert_close(result.images, single.images, atol=TP_VS_SINGLE_ATOL, rtol=0)
    assert (result.images - base.images).abs().max() > 1e-3  # the LoRAs changed the frames
    assert result.info.context_parallel == 2
    notes = [note for note in result.info.notes if note.startswith("LoRA: ")]
    assert [note.split(" @ ")[0] for note in notes] == ["LoRA: high_noise.safetensors", "LoRA: low_noise.safetensors"]
    assert notes[0].endswith("high_noise: transformer)") and notes[1].endswith("low_noise: transformer_2)"), notes
    without = engine.generate(handle_for(tiny, "wan22-t2v-a14b", mesh=cp), video)
    assert not without.info.loaded
    torch.testing.assert_close(without.images, base.images, atol=TP_VS_SINGLE_ATOL, rtol=0)


def test_two_ranks_shard_both_wan_experts_with_the_family_plan_and_give_the_single_process_frames(tiny, engine):
    """Wan 2.2 T2V A14B: diffusers has no `_tp_plan` for WanTransformer3DModel, the family's (FFN, and the value /
    output projections per head) shards `transformer` and `transformer_2`. 3 steps: 999 and 960 run the high-noise
    expert, 857 (below boundary 0.875) the low-noise one. Measured max difference ~8e-7 (the all-reduce order)."""
    video = request(frames=5, steps=3)
    single_engine = Engine(distribute=False)
    single = single_engine.generate(handle_for(tiny, "wan22-t2v-a14b"), video)
    pipe = single_engine.realise(handle_for(tiny, "wan22-t2v-a14b"))[0].pipe
    experts = (pipe.transformer, pipe.transformer_2)
    # what each rank holds when both are sharded: everything, less half of each planned weight
    expected = sum(local_bytes(expert) - planned_bytes(expert) // 2 for expert in experts)

    result = engine.generate(handle_for(tiny, "wan22-t2v-a14b", mesh=MeshSpec(chips=2)), video)
    assert result.images.shape == (5, 64, 64, 3) and result.info.frames == 5
    torch.testing.assert_close(result.images, single.images, atol=TP_VS_SINGLE_ATOL, rtol=0)
    assert result.info.sharded_fraction_per_rank == (0.5, 0.5)
    assert result.info.transformer_bytes_per_rank == (expected, expected)  # a whole second expert would add ~8%


def planned_bytes(model) -> int:
    """Bytes of the parameters the Wan family's TP plan shards in `model`."""
    from diffusers.hooks.tensor_parallel import resolve_tp_shard_specs

    from tpu_diffusers_runtime.families import wan

    params = dict(model.named_parameters())
    specs = resolve_tp_shard_specs(model, wan.tensor_parallel_plan(model.config), 2)
    return sum(params[name].numel() * params[name].element_size() for name, spec in specs.items()
               if spec.dim is not None)


def test_two_replicas_split_a_batch_of_videos_as_one_process_makes_it(tiny, engine):
    """A batch of 2 videos over 2 replicas (one per chip, each a whole pipeline): video i keeps seed + i, so the
    frames are one process's, video after video."""
    video = request(frames=5, steps=3, batch_size=2)
    single = Engine(distribute=False).generate(handle_for(tiny, "wan22-t2v-a14b"), video)
    result = engine.generate(handle_for(tiny, "wan22-t2v-a14b", mesh=MeshSpec(chips=2, shard_transformer=False)),
                             video)
    assert result.info.replica_images == (1, 1) and result.images.shape == (10, 64, 64, 3)
    assert result.info.image_bytes_per_rank == (result.images.numpy().nbytes // 2,) * 2  # each replica its video
    torch.testing.assert_close(result.images, single.images, atol=TP_VS_SINGLE_ATOL, rtol=0)


CONTROL_GROUP_RANK = """
import sys

import runtime_package

runtime_package.load()
import torch.distributed as dist

from tpu_diffusers_runtime.worker_program import RankWorker
from tpu_diffusers_runtime.specs import MeshSpec

dist.init_process_group("gloo")
worker = RankWorker(None, "cpu", None, None)
with open(f"{sys.argv[1]}/rank{dist.get_rank()}.txt", "w") as out:
    for spec in (MeshSpec(context_parallel=2), MeshSpec(replicas=1)):
        mesh, control = worker.device_mesh(spec)
        decision = [dist.get_rank() == 0]
        dist.broadcast_object_list(decision, src=0, group=control)  # as RankWorker.progress sends a cancel decision
        device_group = any(control is mesh.get_group(name) for name in mesh.mesh_dim_names)
        print(spec.context_parallel, dist.get_backend(control), dist.get_process_group_ranks(control), device_group,
              decision[0], file=out)
dist.destroy_process_group()
"""


def test_a_replicas_control_decisions_go_over_a_gloo_group_of_their_own(tmp_path):
    """A replica's first rank broadcasts each step's cancel decision to its other ranks (CP or TP) over a gloo group
    made for control data, not over the device mesh's groups (tpu_dist on a TPU), so no device collective waits on
    a host decision. On CPU the mesh's groups are gloo too: what shows here is a group apart from them, of the
    replica's ranks, gloo, carrying rank 0's decision. Two real ranks under torchrun, the worker's own RankWorker."""
    script = tmp_path / "control_group_rank.py"
    script.write_text(CONTROL_GROUP_RANK)
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           str(script), str(tmp_path)], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    for rank in (0, 1):  # per shape: cp, the group's backend and ranks, whether it is a mesh group, the decision
        assert (tmp_path / f"rank{rank}.txt").read_text() == "2 gloo [0, 1] False True\n1 gloo [0, 1] False True\n"


def test_compiled_mode_runs_inside_the_workers_on_the_sharded_transformer(tiny, engine, tmp_path):
    handle = handle_for(tiny, "flux1-schnell", mesh=MeshSpec(chips=2), mode=ExecutionMode.COMPILED,
                        compile=CompileSpec())
    first = engine.generate(handle, request())
    again = engine.generate(handle, request(seed=19, steps=3))
    single = Engine().generate(handle_for(tiny, "flux1-schnell"), request())
    assert (first.info.compiled_now, again.info.compiled_now) == (True, False)
    torch.testing.assert_close(first.images, single.images, atol=2e-3, rtol=0)


# --- image inputs over worker groups: images and masks travel as binary payloads, replicas keep the pairing

def comfy_images(*seeds):
    """ComfyUI's IMAGE batch of 8-bit random pictures (as Load Image gives): float32 [N, 64, 64, 3] in 0..1."""
    return np.stack([(np.random.default_rng(s).random((64, 64, 3)) * 255).astype(np.uint8) for s in seeds]
                    ).astype(np.float32) / 255.0


def test_two_replicas_run_image_to_image_on_an_image_batch_as_one_process_does(tiny, engine):
    """Replicas 2 x tp 1, batch 2 from an image batch of 2: replica 1 takes image 1 with seed + 1, so the two
    outputs are those of one process (each replica holds a whole pipeline). Not bit for bit: torchrun runs each
    rank with OMP_NUM_THREADS=1, and CPU sums over other thread counts differ by ~2e-6 (text to image too)."""
    inputs = request(batch_size=2, steps=4, images=(comfy_images(1, 2),), denoise=0.6)
    single = Engine(distribute=False).generate(handle_for(tiny, "flux1-schnell"), inputs)
    result = engine.generate(handle_for(tiny, "flux1-schnell", mesh=MeshSpec(chips=2, replicas=2)), inputs)
    assert (result.info.task, result.info.pipeline) == ("image2image", "FluxImg2ImgPipeline")
    assert result.info.mesh_shape == (2, 1, 1) and result.info.replica_images == (1, 1)
    assert (single.images[0] - single.images[1]).abs().max() > 0.5  # a wrong pairing would show
    torch.testing.assert_close(result.images, single.images, atol=TP_VS_SINGLE_ATOL, rtol=0)


def test_two_tp_ranks_run_a_flux2_edit_with_a_reference_as_one_process_does(tiny, engine):
    inputs = request(images=(comfy_images(3),), guidance=4.0)
    single = Engine(distribute=False).generate(handle_for(tiny, "flux2"), inputs)
    result = engine.generate(handle_for(tiny, "flux2", mesh=MeshSpec(chips=2)), inputs)
    assert (result.info.task, result.info.pipeline, result.info.world_size) == ("edit", "Flux2Pipeline", 2)
    assert result.info.sharded_fraction_per_rank == (0.5, 0.5)
    torch.testing.assert_close(result.images, single.images, atol=TP_VS_SINGLE_ATOL, rtol=0)


def test_text_encoders_without_a_tp_plan_stay_whole_and_say_so(tiny, engine):
    result = engine.generate(handle_for(tiny, "flux1-schnell", mesh=MeshSpec(chips=2)), request())
    assert "text_encoder_2 (T5EncoderModel) has no TP plan in transformers: kept whole on every rank" \
        in result.info.notes


def test_bad_meshes_are_refused_before_anything_launches(tiny, engine, monkeypatch):
    with pytest.raises(UserInputError, match="SD3Transformer2DModel has no tensor-parallel plan"):
        engine.generate(handle_for(tiny, "sd3", mesh=MeshSpec(chips=2)), request())
    with pytest.raises(UserInputError, match="asks for 4096 chips but this host has"):
        engine.generate(handle_for(tiny, "flux1-schnell", mesh=MeshSpec(chips=4096)), request())
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    with pytest.raises(UserInputError, match=r"tp 3 \(chips / replicas\) does not divide the transformer's 2 "
                                             r"attention heads; make chips / replicas one of \[1, 2\]"):
        engine.generate(handle_for(tiny, "flux1-schnell", mesh=MeshSpec(chips=3)), request())
    with pytest.raises(UserInputError, match="placement to 'device'"):
        engine.generate(handle_for(tiny, "flux1-schnell", mesh=MeshSpec(chips=2),
                                   placement=Placement.MODEL_CPU_OFFLOAD), request())
    assert engine.workers.current is None  # nothing was launched


def test_cancel_stops_every_rank_and_the_group_stays_warm(tiny, engine):
    handle = handle_for(tiny, "flux1-schnell", mesh=MeshSpec(chips=2))
    engine.generate(handle, request())

    class Cancelled(Exception):
        pass

    seen = []

    def cancel_at_step_2(done, total, what):
        seen.append(done)
        if what == "sampling" and done == 2:
            raise Cancelled

    with pytest.raises(Cancelled):
        engine.generate(handle, request(steps=500, seed=13), on_progress=cancel_at_step_2)
    assert seen[-1] <= 3  # stopped within one step of the cancel
    assert not engine.generate(handle, request(seed=14)).info.loaded


def test_cancel_while_the_workers_start_leaves_nothing_running(tiny, engine):
    class Cancelled(Exception):
        pass

    def cancel_while_starting(done, total, what):
        if what.startswith("starting") and launched_workers():
            raise Cancelled

    with pytest.raises(Cancelled):
        engine.generate(handle_for(tiny, "flux1-schnell", mesh=MeshSpec(chips=2)), request(),
                        on_progress=cancel_while_starting)
    assert engine.workers.current is None and launched_workers() == []


def test_a_killed_worker_fails_the_run_clearly_and_the_next_run_relaunches(tiny, engine):
    handle = handle_for(tiny, "flux1-schnell", mesh=MeshSpec(chips=2))
    first = engine.generate(handle, request())
    launcher, rank0, rank1 = first.info.worker_pids
    steps_seen = []

    def kill_rank1_at_step_2(done, total, what):
        if what == "sampling":
            steps_seen.append(done)
            if done == 2:
                os.kill(rank1, signal.SIGKILL)

    with pytest.raises(WorkerGroupError, match=r"worker rank 1 .*failed.*(-9|SIGKILL)"):
        engine.generate(handle, request(width=256, height=256, steps=10_000, seed=15), on_progress=kill_rank1_at_step_2)
    # rank 0 cannot finish a step without rank 1, so the run stopped within a step of where rank 1 died; this
    # process may see a few more steps than 2 (rank 0's progress messages were already on their way when it
    # killed rank 1: CI once saw 4), never the 10,000 a run that went on would report
    assert steps_seen[-1] < 100
    assert engine.workers.current is None  # the dead group was dropped
    assert alive_after((launcher, rank0, rank1)) == []

    again = engine.generate(handle, request(seed=16))
    assert again.info.loaded and set(again.info.worker_pids).isdisjoint(first.info.worker_pids)


def test_an_exception_on_one_rank_is_reported_with_its_rank_and_message(tmp_path):
    """torchrun's real failure report (not a copy of it): rank 1 raises, rank 0 is torn down."""
    script = tmp_path / "fails_on_rank_1.py"
    script.write_text(
        "import os, time\n"
        "from torch.distributed.elastic.multiprocessing.errors import record\n"
        "@record\n"
        "def main():\n"
        "    if os.environ['RANK'] == '1':\n"
        "        raise ValueError('out of memory on rank 1, as an example')\n"
        "    time.sleep(60)\n"
        "main()\n")
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    cause = root_cause(done.stdout + done.stderr)
    assert cause.startswith("worker rank 1 failed (exit code 1"), cause
    assert "ValueError: out of memory on rank 1, as an example" in cause


def test_an_exception_on_one_rank_alone_stops_the_group_and_names_the_rank(tiny, engine, tmp_path, monkeypatch):
    """Rank 1 fails where rank 0 goes on into a collective that now never completes: no hang, and the
    error is rank 1's own. (sitecustomize runs in every Python process the launch starts.)"""
    (tmp_path / "sitecustomize.py").write_text(
        "import os, sys\n"
        "if os.environ.get('RANK') == '1':\n"
        f"    sys.path.insert(0, {str(ROOT)!r})\n"
        "    import runtime_package\n"
        "    runtime_package.load()\n"
        "    from tpu_diffusers_runtime.tasks.text2image import Text2Image\n"
        "    def run(*args, **kwargs):\n"
        "        raise MemoryError('rank 1 ran out of memory, as an example')\n"
        "    Text2Image.run = run\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])))
    with pytest.raises(WorkerGroupError, match=r"worker rank 1 .*failed.*MemoryError: rank 1 ran out of memory"):
        engine.generate(handle_for(tiny, "flux1-schnell", mesh=MeshSpec(chips=2)), request())
    assert engine.workers.current is None and launched_workers() == []


def test_a_request_that_fails_on_every_rank_is_answered_with_its_error_and_the_group_stays_warm(tiny, engine,
                                                                                                 tmp_path):
    folder = tmp_path / "flux"
    shutil.copytree(tiny("flux1-schnell"), folder)
    scheduler_config = folder / "scheduler" / "scheduler_config.json"
    good_config = scheduler_config.read_text()
    scheduler_config.write_text("{ not json")
    handle = PipelineHandle.of(source=str(folder), model_class="FluxPipeline", mesh=MeshSpec(chips=2))

    with pytest.raises(ModelLoadError, match="could not load component 'scheduler'"):
        engine.generate(handle, request())
    group = engine.workers.current
    assert group.alive()

    scheduler_config.write_text(good_config)  # fixed: the same workers load it now
    loaded = engine.generate(handle, request())
    assert loaded.info.loaded and loaded.info.worker_pids[0] == group.process.pid

    # a plan the ComfyUI side would refuse first (a model class the pack does not run), sent to the workers as it is
    plan = plan_request(handle, request()).to_wire()
    with pytest.raises(UserInputError, match="'UnknownPipeline', which TPU Diffusers does not run"):
        group.generate(handle, {**plan, "model_class": "UnknownPipeline"}, request())
    again = engine.generate(handle, request(seed=21))
    assert not again.info.loaded and again.info.worker_pids == loaded.info.worker_pids


@pytest.mark.parametrize("kind, raised, text", [
    ("UserInputError", UserInputError, "width 1000 cannot be used"),
    ("ModelLoadError", ModelLoadError, "width 1000 cannot be used"),
    ("CompileError", CompileError, "width 1000 cannot be used"),
    ("RuntimeError", WorkerRequestError, "every worker rank failed with RuntimeError: width 1000 cannot be used"),
])
def test_an_error_reply_raises_the_same_kind_of_error_as_one_process_would(kind, raised, text):
    error = from_wire(kind, "width 1000 cannot be used")
    assert type(error) is raised and str(error) == text


def test_the_workers_log_is_private_and_unload_stops_the_workers(tiny, engine):
    result = engine.generate(handle_for(tiny, "flux1-schnell", mesh=MeshSpec(chips=2)), request())
    log = engine.workers.current.log_path.stat()
    assert stat.S_IMODE(log.st_mode) == 0o600 and log.st_uid == os.getuid()
    assert engine.unload() >= 1
    assert alive_after(result.info.worker_pids) == []


@pytest.mark.parametrize("name", ["transformer", "text_encoder"])
def test_an_unreadable_config_is_a_model_load_error(tiny, tmp_path, name):
    folder = tmp_path / "flux"
    shutil.copytree(tiny("flux1-schnell"), folder)
    (folder / name / "config.json").write_text("{ not json")
    with pytest.raises(ModelLoadError, match=f"cannot read {name}/config.json of "):
        check_mesh(MeshSpec(chips=2), str(folder), device_info("cpu"))


def _accept_one(listener, key):
    with contextlib.suppress(channel.AuthenticationError, OSError, EOFError):
        channel.accept(listener, key)


@pytest.mark.parametrize("address, key, raised, message", [
    ("localhost7777", None, UserInputError, "address 'localhost7777' is not host:port"),
    ("LISTENING", "not hex", UserInputError, "the control key is not hex: it must be 64 hex digits"),
    ("LISTENING", "0123abcd", UserInputError, "the control key has 8 hex digits; it must be 64"),
    ("NOTHING", None, ConnectionError, "nothing listens at 127.0.0.1:"),
    ("SILENT", None, ConnectionError, r"no answer from 127.0.0.1:\d+ within 1s"),
    ("LISTENING", "OTHER", UserInputError, r"the workers at 127.0.0.1:\d+ refused the key"),
])
def test_each_way_a_connection_fails_has_its_own_message(address, key, raised, message):
    """LISTENING: a control channel with its own key; SILENT: a port that accepts and never answers."""
    workers_key = channel.new_key()
    with contextlib.ExitStack() as stack:
        if address == "LISTENING":
            listener = channel.listen("127.0.0.1:0")
            stack.callback(listener.close)
            threading.Thread(target=_accept_one, args=(listener, workers_key), daemon=True).start()
            address = "127.0.0.1:%d" % listener.getsockname()[1]
        elif address == "SILENT":
            silent = stack.enter_context(socket.create_server(("127.0.0.1", 0)))
            address = "127.0.0.1:%d" % silent.getsockname()[1]
        elif address == "NOTHING":
            address = f"127.0.0.1:{free_port()}"
        key = {None: workers_key, "OTHER": channel.new_key()}.get(key, key)
        with pytest.raises(raised, match=message) as error:
            channel.connect(address, key, timeout=1)
    assert workers_key not in str(error.value)


@pytest.mark.parametrize("allowed", [None, "10.0.0.2:7777, 127.0.0.2", "localhost,[::1]"])
def test_attach_connects_only_to_an_address_the_environment_allows(tiny, engine, monkeypatch, allowed):
    """A workflow names the attach address, and whoever made it may not be who runs it: unless
    $TPU_DIFFUSERS_ATTACH_ALLOW lists the address (a host alone: any of its ports), nothing connects there."""
    monkeypatch.setenv(channel.KEY_ENV, channel.new_key())
    if allowed is None:
        monkeypatch.delenv(channel.ATTACH_ALLOW_ENV, raising=False)
    else:
        monkeypatch.setenv(channel.ATTACH_ALLOW_ENV, allowed)
    with socket.create_server(("127.0.0.1", 0)) as listener:
        address = "127.0.0.1:%d" % listener.getsockname()[1]
        mesh = MeshSpec(workers=Workers.ATTACH, address=address)
        refused = f"address '{address}' is not in \\$TPU_DIFFUSERS_ATTACH_ALLOW"
        with pytest.raises(UserInputError, match=refused) as error:
            engine.generate(handle_for(tiny, "flux1-schnell", mesh=mesh), request())
        with pytest.raises(UserInputError, match=refused):
            WorkerGroup.attach(mesh)  # where the connection would be made
        listener.setblocking(False)
        with pytest.raises(BlockingIOError):
            listener.accept()  # nothing ever connected
    assert f"add {address} to $TPU_DIFFUSERS_ATTACH_ALLOW" in str(error.value)
    assert ("It allows: nothing (it is unset)." if allowed is None else f"It allows: {allowed.replace(' ', '')}.") \
        in str(error.value).replace(", ", ",")
    assert engine.workers.current is None
    for entry in (address, "127.0.0.1", f"10.0.0.2:7777,{address}"):
        monkeypatch.setenv(channel.ATTACH_ALLOW_ENV, entry)
        channel.check_attach_address(address)  # allowed: no error


def test_attach_to_workers_started_by_torchrun_on_two_hosts(tiny, engine, monkeypatch):
    """Two `torchrun --nnodes=2` "hosts" on loopback, as on a two-host TPU slice; the node attaches."""
    key, master_port, control = channel.new_key(), free_port(), f"127.0.0.1:{free_port()}"
    env = {**os.environ, channel.KEY_ENV: key}
    hosts = [subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nnodes=2", f"--node_rank={rank}",
                               "--nproc_per_node=1", "--master_addr=127.0.0.1", f"--master_port={master_port}",
                               str(WORKER_SCRIPT), "--control", control, "--stay"],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
              for rank in (0, 1)]
    # what the user of attach sets for the ComfyUI process: the key (never the workflow's) and the address
    monkeypatch.setenv(channel.KEY_ENV, key)
    monkeypatch.setenv(channel.ATTACH_ALLOW_ENV, control)
    try:
        mesh = MeshSpec(chips=2, workers=Workers.ATTACH, address=control)
        deadline = time.monotonic() + 180
        while True:  # the hosts take a while to start; the node would just be queued again
            try:
                result = engine.generate(handle_for(tiny, "flux1-schnell", mesh=mesh), request())
                break
            except ConnectionError:
                assert time.monotonic() < deadline and all(h.poll() is None for h in hosts)
                time.sleep(1)
        single = Engine().generate(handle_for(tiny, "flux1-schnell"), request())
        torch.testing.assert_close(result.images, single.images, atol=TP_VS_SINGLE_ATOL, rtol=0)
        assert "attached" in " ".join(result.info.notes)
        engine.unload()  # detaches; the workers stay up for the next client
        with pytest.raises(UserInputError, match="refused the key"):
            channel.connect(control, channel.new_key(), timeout=30)
        assert all(h.poll() is None for h in hosts)
        again = engine.generate(handle_for(tiny, "flux1-schnell", mesh=mesh), request(seed=18))
        assert again.info.loaded  # unload asked the attached workers to drop the pipeline
        assert key not in repr(handle_for(tiny, "flux1-schnell", mesh=mesh).to_wire())  # nowhere in what travels
        # the same workers as one replica per "host": the shape is chosen per prompt
        per_host = MeshSpec(chips=2, replicas=2, workers=Workers.ATTACH, address=control)
        spanning = engine.generate(handle_for(tiny, "flux1-schnell", mesh=per_host), request(batch_size=2))
        single_batch = Engine().generate(handle_for(tiny, "flux1-schnell"), request(batch_size=2))
        torch.testing.assert_close(spanning.images, single_batch.images, atol=TP_VS_SINGLE_ATOL, rtol=0)
        assert spanning.info.mesh_shape == (2, 1, 1) and spanning.info.replica_ranks == ((0,), (1,))
    finally:
        for host in hosts:
            os.killpg(host.pid, signal.SIGTERM)
        for host in hosts:
            host.wait(30)


def test_compiled_context_parallel_video_equals_eager_in_one_process(tiny, engine):
    """Compiled mode inside CP workers: the repeated blocks of both experts compile around diffusers' Ulysses
    all-to-all, with fullgraph off (its hooks break the graph: refused before launch with fullgraph on), and the
    frames equal one eager process."""
    video = request(frames=5, steps=3)
    fullgraph = handle_for(tiny, "wan22-t2v-a14b", mesh=MeshSpec(chips=2, context_parallel=2),
                           mode=ExecutionMode.COMPILED, compile=CompileSpec())
    with pytest.raises(UserInputError, match="context parallelism needs fullgraph off"):
        engine.generate(fullgraph, video)
    handle = handle_for(tiny, "wan22-t2v-a14b", mesh=MeshSpec(chips=2, context_parallel=2), mode=ExecutionMode.COMPILED,
                        compile=CompileSpec(scope="repeated_blocks", fullgraph=False))
    first = engine.generate(handle, video)
    again = engine.generate(handle, dataclasses.replace(video, seed=video.seed + 1))
    single = Engine(distribute=False).generate(handle_for(tiny, "wan22-t2v-a14b"), video)
    assert (first.info.compiled_now, again.info.compiled_now) == (True, False)
    torch.testing.assert_close(first.images, single.images, atol=2e-3, rtol=0)
