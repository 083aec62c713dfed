"""Data parallelism over the worker group: replicas x tp meshes on CPU ranks (gloo)."""

import os
import signal

import pytest
import torch

from processes import alive_after, pid_alive
from test_tensor_parallel import TP_VS_SINGLE_ATOL, handle_for, request

from tpu_diffusers_runtime import device
from tpu_diffusers_runtime.device import TPU_KIND_BY_PCI_DEVICE, device_info
from tpu_diffusers_runtime.errors import WorkerGroupError
from tpu_diffusers_runtime.distributed.mesh import check_mesh, mesh_shape, queued_world_size_problem, split_batch
from tpu_diffusers_runtime.distributed.sharding import local_bytes
from tpu_diffusers_runtime.engine import Engine
from tpu_diffusers_runtime.errors import UserInputError
from tpu_diffusers_runtime.handle import PipelineHandle
from tpu_diffusers_runtime.specs import CompileSpec, ExecutionMode, MeshSpec

TWO_REPLICAS = MeshSpec(chips=2, replicas=2)


@pytest.fixture
def engine():
    engine = Engine()
    yield engine
    engine.unload()


@pytest.fixture(scope="module")
def single(tiny_dir):
    """One process, whole batches: what every mesh shape must reproduce."""
    engine = Engine()
    handle = handle_for(lambda name: str(tiny_dir / f"tiny-{name}"), "flux1-schnell")
    cache = {}

    def generation(batch_size):
        if batch_size not in cache:
            cache[batch_size] = engine.generate(handle, request(batch_size=batch_size))
        return cache[batch_size]

    def images(batch_size):
        return generation(batch_size).images

    images.latent = lambda batch_size: generation(batch_size).latent["samples"]
    images.full_bytes = lambda: local_bytes(engine.realise(handle)[0].pipe.transformer)
    return images


def test_the_batch_is_split_into_contiguous_slices_the_first_replicas_taking_the_extra_images():
    assert split_batch(4, 2) == [(0, 2), (2, 2)]
    assert split_batch(3, 2) == [(0, 2), (2, 1)]
    assert split_batch(1, 2) == [(0, 1), (1, 0)]
    assert split_batch(5, 4) == [(0, 2), (2, 1), (3, 1), (4, 1)]


def test_replicas_default_to_as_many_as_fit():
    assert mesh_shape(MeshSpec(), 8) == (1, 1, 8)  # sharded: one replica over every chip
    assert mesh_shape(MeshSpec(shard_transformer=False), 8) == (8, 1, 1)  # fits one chip: one replica per chip
    assert mesh_shape(MeshSpec(replicas=2), 8) == (2, 1, 4)
    assert mesh_shape(MeshSpec(context_parallel=2), 8) == (4, 2, 1)  # context parallel: one replica per 2 chips
    assert mesh_shape(MeshSpec(replicas=1, context_parallel=8), 8) == (1, 8, 1)


def test_a_loaded_pipeline_is_keyed_on_the_layout_its_ranks_run_and_not_on_how_it_was_asked_for():
    """(replicas, cp, tp) as mesh_shape resolves the spec on the ranks, and under tp what is sharded."""
    handle = PipelineHandle.of(source="/models/wan", model_class="WanPipeline")
    cpu = device_info("cpu")

    def key(**mesh):
        return handle.replace(mesh=MeshSpec(chips=8, **mesh)).load_key(cpu)

    assert key(replicas=1) != key(replicas=1, context_parallel=8)  # TP and CP on the same chips
    assert key(context_parallel=2) != key(context_parallel=4)  # 4 x cp 2, 2 x cp 4
    assert key(context_parallel=2, shard_transformer=False) != key(shard_transformer=False)  # 4 x cp 2, 8 replicas
    assert key(replicas=2) != key(replicas=2, shard_text_encoder=False)  # under tp, what is sharded
    assert key(replicas=8) == key(shard_transformer=False) == key(replicas=8, shard_text_encoder=False)  # tp 1
    assert key(context_parallel=2) == key(replicas=4, context_parallel=2, shard_transformer=False)


def test_context_parallel_refuses_what_cannot_run_before_anything_loads(tiny, engine, monkeypatch):
    """A replica is CP or TP (diffusers takes one); the latent tokens (latent frames x h x w) and the heads must
    divide by the CP degree; a denoiser without a CP plan (diffusers' _cp_plan, or its family's) is refused naming
    the families with one."""
    from tpu_diffusers_runtime.distributed.mesh import context_parallel_notes, families_with_cp_plan, latent_tokens
    from tpu_diffusers_runtime.families import family_for

    with pytest.raises(UserInputError, match=r"leaves 2 chips per replica for tensor parallelism, and diffusers runs "
                                             r"a model context parallel or tensor parallel, not both. Set replicas "
                                             r"to 2 \(or 0\)"):
        mesh_shape(MeshSpec(replicas=1, context_parallel=2), 4)
    with pytest.raises(UserInputError, match=r"context_parallel 3 does not divide the mesh's 4 chips"):
        mesh_shape(MeshSpec(context_parallel=3), 4)
    wan = family_for("WanPipeline")
    assert latent_tokens(wan, 64, 64, 5) == 2 * 4 * 4 and latent_tokens(wan, 48, 48, 9) == 3 * 3 * 3
    with pytest.raises(UserInputError, match=r"context_parallel 2 does not divide the 27 latent tokens of 48x48 x 9 "
                                             r"frames; use frames 5 or 13 at 48x48, or width 32 or 64 at height 48"):
        context_parallel_notes(2, wan, request(width=48, height=48, frames=9), tiny("wan22-t2v-a14b"))
    # LTX-2's first/last frame appends its last frame as one latent frame of tokens; an upscaler's first stage runs at
    # half the size: 64x64 x 9 frames is then 32x32, (2 + 1) x 1 x 1 tokens
    ltx2 = family_for("LTX2Pipeline")
    with pytest.raises(UserInputError, match=r"context_parallel 2 does not divide the 3 latent tokens of 32x32 x 9 "
                                             r"frames \(the first stage's half size\); use frames 1 or 17 at 64x64"):
        context_parallel_notes(2, ltx2, request(width=64, height=64, frames=9, upscaler="upscaler"), "ltx2", 1)
    assert context_parallel_notes(2, ltx2, request(width=64, height=64, frames=9), "ltx2", 1)[0].endswith(
        "12 latent tokens, 6 on each rank")  # (2 + 1) x 2 x 2, at the asked size only
    assert families_with_cp_plan() == "FLUX.1, FLUX.2, QwenImage, FLUX.2 [klein], Wan 2.2, LTX-2 and MiniMax H3"
    # MiniMax H3's 17n + 5 frames make 5n + 2 latent frames (its own count); its sequence holds the prompt's text
    # tokens, unpadded, so its length is not known here: it is split unevenly where the ranks do not divide it
    h3 = family_for("MiniMaxH3ModularPipeline")
    assert latent_tokens(h3, 32, 32, 124) == 37 and latent_tokens(h3, 96, 32, 141) == 42 * 3
    assert context_parallel_notes(2, h3, request(width=96, height=32, frames=124), "hub/id")[0].endswith(
        "111 latent tokens of video with the text's and the sound's in one sequence, split as evenly as its length "
        "allows")
    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    with pytest.raises(UserInputError, match=r"SD3/SD3.5's SD3Transformer2DModel has no context-parallel plan, in "
                                             r"diffusers or this pack \(FLUX.1, FLUX.2, QwenImage, FLUX.2 \[klein\], "
                                             r"Wan 2.2, LTX-2 and MiniMax H3 have one\); set context_parallel to 1"):
        engine.generate(handle_for(tiny, "sd3", mesh=MeshSpec(chips=2, context_parallel=2)), request())
    with pytest.raises(UserInputError, match=r"context_parallel 4 does not divide the transformer's 2 attention heads "
                                             r"\(Ulysses attention splits them over the ranks\); use one of \[1, 2\]"):
        engine.generate(handle_for(tiny, "wan22-t2v-a14b", mesh=MeshSpec(chips=4, context_parallel=4)),
                        request(frames=5))
    assert engine.workers.current is None  # nothing was launched


def test_context_parallel_refuses_a_hub_id_before_anything_launches(tiny, engine, monkeypatch):
    """A download reports progress by the clock, and a replica's CP ranks meet in a collective at each progress
    point: they would make different numbers of them and deadlock. So a hub id is refused, as for TP."""
    from tpu_diffusers_runtime.handle import PipelineHandle

    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    hub_id, mesh = "Wan-AI/Wan2.2-T2V-A14B-Diffusers", MeshSpec(chips=2, context_parallel=2)
    refusal = rf"context parallelism .*; download '{hub_id}' into models/diffusers and pick the folder"
    with pytest.raises(UserInputError, match=refusal):
        check_mesh(mesh, hub_id, device_info("cpu"))
    with pytest.raises(UserInputError, match=refusal):
        engine.generate(PipelineHandle.of(source=hub_id, model_class="WanPipeline", mesh=mesh), request(frames=5))
    assert engine.workers.current is None  # nothing was launched
    assert check_mesh(mesh, tiny("wan22-t2v-a14b"), device_info("cpu"))  # a folder runs
    assert check_mesh(TWO_REPLICAS, hub_id, device_info("cpu"))  # replicas load as one process does: a hub id runs


def test_two_replicas_give_the_single_process_images_in_order_and_stay_warm(tiny, engine, single):
    handle = handle_for(tiny, "flux1-schnell", mesh=TWO_REPLICAS)
    runs = {batch: engine.generate(handle, request(batch_size=batch)) for batch in (2, 3, 4, 1)}
    for batch, result in runs.items():
        torch.testing.assert_close(result.images, single(batch), atol=TP_VS_SINGLE_ATOL, rtol=0)
        # the LATENT output comes back from the workers too, in batch order
        torch.testing.assert_close(result.latent["samples"], single.latent(batch), atol=TP_VS_SINGLE_ATOL, rtol=0)
        assert result.info.mesh_shape == (2, 1, 1) and result.info.replica_ranks == ((0,), (1,))
        assert result.info.replica_images == {2: (1, 1), 3: (2, 1), 4: (2, 2), 1: (1, 0)}[batch]
    # each replica holds a whole pipeline: nothing is sharded at tp 1
    assert runs[2].info.sharded_fraction_per_rank == (1.0, 1.0)
    assert runs[2].info.transformer_bytes_per_rank == (single.full_bytes(),) * 2
    notes = {batch: " ".join(result.info.notes) for batch, result in runs.items()}
    assert "uneven split" in notes[3] and "uneven split" not in notes[4]
    assert "replicas [1] had no image" in notes[1]
    # warm: the first run loaded; the others reused the same workers and pipelines
    assert runs[2].info.loaded and not any(runs[batch].info.loaded for batch in (3, 4, 1))
    assert len({result.info.worker_pids for result in runs.values()}) == 1


def test_two_replicas_of_two_tp_ranks_give_the_single_process_images(tiny, engine, single, monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 4)  # this host may have fewer cores than ranks: they share
    result = engine.generate(handle_for(tiny, "flux1-schnell", mesh=MeshSpec(chips=4, replicas=2)),
                             request(batch_size=3))
    torch.testing.assert_close(result.images, single(3), atol=TP_VS_SINGLE_ATOL, rtol=0)
    assert result.info.mesh_shape == (2, 1, 2) and result.info.replica_ranks == ((0, 1), (2, 3))
    assert result.info.replica_images == (2, 1)
    assert result.info.sharded_fraction_per_rank == (0.5,) * 4  # half of every sharded weight on each rank
    assert max(result.info.transformer_bytes_per_rank) < 0.8 * single.full_bytes()


def test_compiled_mode_and_warm_up_run_in_every_replica_and_the_second_prompt_compiles_nothing(tiny, engine,
                                                                                              single):
    handle = handle_for(tiny, "flux1-schnell", mesh=TWO_REPLICAS, mode=ExecutionMode.COMPILED,
                        compile=CompileSpec(warmup_sizes=((64, 64),)))
    first = engine.generate(handle, request(batch_size=2))
    again = engine.generate(handle, request(batch_size=2, seed=12))
    assert all(seconds > 0 for seconds in first.info.replica_compile_seconds)  # each replica compiled its own
    assert "warm-up: compiled now for 64x64 (batch 1): 1 graph(s)" in " ".join(first.info.notes)
    assert again.info.replica_compile_seconds == (0.0, 0.0) and again.info.compiled_now is False
    assert not again.info.loaded
    torch.testing.assert_close(first.images, single(2), atol=2e-3, rtol=0)


def test_cancel_stops_every_replica_and_the_group_stays_warm(tiny, engine):
    handle = handle_for(tiny, "flux1-schnell", mesh=TWO_REPLICAS)
    engine.generate(handle, request(batch_size=2))

    class Cancelled(Exception):
        pass

    seen = []

    def cancel_at_step_2(done, total, what):
        if what == "sampling":
            seen.append((done, total))
            if done >= 2:
                raise Cancelled

    with pytest.raises(Cancelled):
        engine.generate(handle, request(steps=500, batch_size=2, seed=13), on_progress=cancel_at_step_2)
    assert {total for _, total in seen} == {1000}  # steps counted over both replicas
    again = engine.generate(handle, request(batch_size=2, seed=14))
    assert not again.info.loaded  # the same warm group, and no replica still running the cancelled batch


def test_a_killed_replica_fails_the_run_naming_its_rank_and_the_next_run_relaunches(tiny, engine):
    handle = handle_for(tiny, "flux1-schnell", mesh=TWO_REPLICAS)
    first = engine.generate(handle, request(batch_size=2))
    launcher, rank0, rank1 = first.info.worker_pids

    def kill_rank1_at_step_2(done, total, what):
        # `done` counts the steps of both replicas together, so it may pass 2 without being 2
        if what == "sampling" and done >= 2 and pid_alive(rank1):
            os.kill(rank1, signal.SIGKILL)

    with pytest.raises(WorkerGroupError, match=r"worker rank 1 .*failed.*(-9|SIGKILL)"):
        engine.generate(handle, request(width=256, height=256, steps=10_000, batch_size=2, seed=15),
                        on_progress=kill_rank1_at_step_2)
    assert engine.workers.current is None
    assert alive_after((launcher, rank0, rank1)) == []
    again = engine.generate(handle, request(batch_size=2, seed=16))
    assert again.info.loaded and set(again.info.worker_pids).isdisjoint(first.info.worker_pids)


def test_bad_meshes_are_refused_before_anything_launches(tiny, engine, monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    with pytest.raises(UserInputError, match=r"2 chips cannot be split into 3 replicas \(replicas x tp must equal "
                                             r"the chips\); use one of \[1, 2\] replicas"):
        engine.generate(handle_for(tiny, "flux1-schnell", mesh=MeshSpec(chips=2, replicas=3)), request())
    with pytest.raises(UserInputError, match=r"tp 4 \(chips / replicas\) does not divide the transformer's 2 "
                                             r"attention heads; make chips / replicas one of \[1, 2\]"):
        engine.generate(handle_for(tiny, "flux1-schnell", mesh=MeshSpec(chips=8, replicas=2)), request())
    assert engine.workers.current is None  # nothing was launched
    # at tp 1 nothing is sharded, so a transformer without a TP plan (SD3) can have replicas
    notes = check_mesh(MeshSpec(chips=2, replicas=2), tiny("sd3"), device_info("cpu"))
    assert "tp 1: nothing is sharded, each replica holds the whole pipeline" in notes


@pytest.mark.parametrize("kind, pci_id", [(kind, pci) for pci, kind in TPU_KIND_BY_PCI_DEVICE.items()])
def test_a_tpu_host_refuses_rank_counts_torch_tpu_cannot_launch_naming_those_it_can(tiny, monkeypatch, kind, pci_id):
    """ComfyUI's process on a TPU host of 8 chips of each generation (a fake PCI bus: no TPU here): torch_tpu 0.2.0's
    launch environment knows 1, 4 and 8 ranks on v5e and v6e, 1, 2, 4 and 8 on v4 and v5p, 2, 4 and 8 on v7 (one
    rank runs without it): any other count is refused before anything launches."""
    monkeypatch.setattr(device, "tpu_pci_models", lambda: [pci_id] * 8)
    monkeypatch.setenv(device.TPU_IN_WORKERS_ENV, "8")  # ComfyUI's process: chips are counted on the PCI bus
    launchable = {"v4": [1, 2, 4, 8], "v5p": [1, 2, 4, 8], "v5e": [1, 4, 8], "v6e": [1, 4, 8], "v7": [1, 2, 4, 8]}
    for ranks in range(1, 9):
        replicas = MeshSpec(chips=ranks, replicas=ranks)  # tp 1: nothing of the model is read
        if ranks in launchable[kind]:
            check_mesh(replicas, tiny("flux1-schnell"), device_info("tpu"))
            assert queued_world_size_problem(ranks) is None
            continue
        with pytest.raises(UserInputError) as refused:
            check_mesh(replicas, tiny("flux1-schnell"), device_info("tpu"))
        assert queued_world_size_problem(ranks) == str(refused.value)  # the TP Mesh node's check when queued
        can = ", ".join(map(str, launchable[kind][:-1])) + " or 8"
        assert str(refused.value) == (
            f"TorchTPU cannot launch {ranks} ranks on a {kind} host: torch_tpu 0.2.0 has launch topologies for "
            f"{', '.join(map(str, device.TPU_WORLD_SIZES[kind]))} ranks there. This host has 8 {kind} chips: set "
            f"chips to {can} (replicas x tp, or replicas x context_parallel, equal to it).")


def test_zimage_refuses_tp_saying_what_works_and_its_replicas_give_the_single_process_images(tiny, engine):
    """diffusers has no TP plan for ZImageTransformer2DModel: the mesh names the families that shard (from their
    denoisers' _tp_plan) and points to replicas, which run it as one process does."""
    from tpu_diffusers_runtime.distributed.mesh import shardable_families

    assert shardable_families() == ("FLUX.1, FLUX.2, QwenImage, FLUX.2 [klein], Wan 2.2, Qwen-Image 2.1, LTX-2 and "
                                    "MiniMax H3")
    with pytest.raises(UserInputError, match=r"ZImageTransformer2DModel has no tensor-parallel plan in diffusers, so "
                                             r"it cannot be sharded \(FLUX.1, FLUX.2, QwenImage, FLUX.2 \[klein\], Wan 2.2, Qwen-Image 2.1, LTX-2 "
                                             r"and MiniMax H3 can\). "
                                             r"Use replicas instead: turn shard_transformer off"):
        engine.generate(handle_for(tiny, "zimage", mesh=MeshSpec(chips=2)), request())
    assert engine.workers.current is None  # refused before anything launched
    inputs = request(batch_size=2)
    single = Engine(distribute=False).generate(handle_for(tiny, "zimage"), inputs)
    result = engine.generate(handle_for(tiny, "zimage", mesh=MeshSpec(chips=2, shard_transformer=False)), inputs)
    assert result.info.mesh_shape == (2, 1, 1) and result.info.replica_images == (1, 1)
    torch.testing.assert_close(result.images, single.images, atol=TP_VS_SINGLE_ATOL, rtol=0)


@pytest.mark.parametrize("name", ["sdxl", "flux3"])
def test_replicas_of_a_family_without_a_tp_plan_give_the_single_process_images(tiny, engine, name):
    """SDXL's UNet and FLUX 3 [klein]'s transformer (a modular pipeline, its prompt upsampler on) have no TP plan
    either: they are refused as TP like Z-Image, and two replicas (one worker-group launch) run them as one process
    does."""
    with pytest.raises(UserInputError, match=r"has no tensor-parallel plan in diffusers, so it cannot be sharded"):
        engine.generate(handle_for(tiny, name, mesh=MeshSpec(chips=2)), request())
    assert engine.workers.current is None  # refused before anything launched
    inputs = request(batch_size=2)
    single = Engine(distribute=False).generate(handle_for(tiny, name), inputs)
    result = engine.generate(handle_for(tiny, name, mesh=MeshSpec(chips=2, shard_transformer=False)), inputs)
    assert result.info.mesh_shape == (2, 1, 1) and result.info.replica_images == (1, 1)
    torch.testing.assert_close(result.images, single.images, atol=TP_VS_SINGLE_ATOL, rtol=0)
