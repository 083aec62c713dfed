"""One plan per request (runtime/plan.py): what it resolves before anything loads, its trip to a worker rank, its
refinement once a model's settings are known, and RunInfo's trip back from rank 0."""

import dataclasses
import json

import numpy as np
import pytest

from tpu_diffusers_runtime.device import resolve_device
from tpu_diffusers_runtime.errors import UserInputError
from tpu_diffusers_runtime.handle import PipelineHandle
from tpu_diffusers_runtime.plan import Plan, family_of, plan_request
from tpu_diffusers_runtime.run_info import RunInfo
from tpu_diffusers_runtime.specs import MeshSpec
from tpu_diffusers_runtime.tasks import SampleRequest, validate_size


def request(**fields):
    return SampleRequest(**{**dict(prompt="a corgi", width=64, height=64, steps=2, guidance=3.0, seed=7,
                                   batch_size=2), **fields})


def test_a_plan_holds_the_family_as_the_models_settings_make_it(tiny):
    plan = plan_request(PipelineHandle.of(source=tiny("wan22-ti2v-5b"), model_class="WanPipeline"),
                        request(frames=5))
    assert plan.family.size_multiple == 32 and plan.settings == {"expand_timesteps": True}
    assert (plan.task.name, plan.pipeline.cls, plan.outputs, plan.layout) == ("text2video", "WanPipeline", ("frames",), None)
    assert plan.device == resolve_device("auto")
    a14b = plan_request(PipelineHandle.of(source=tiny("wan22-t2v-a14b"), model_class="WanPipeline"),
                        request(frames=5))
    assert a14b.family.size_multiple == 16 and a14b.outputs == ("frames",)


def test_warm_up_sizes_are_checked_with_the_models_settings(tiny):
    """TPU Compile Transformer checks its sizes with `family_of`: Wan 2.2 TI2V-5B's step is 32, so 48 px, which the
    run refuses, is refused on that node too (the family without settings, Wan's 16 px step, accepted it)."""
    five_b = PipelineHandle.of(source=tiny("wan22-ti2v-5b"), model_class="WanPipeline")
    with pytest.raises(UserInputError, match="multiple of 32"):
        validate_size(family_of(five_b), 48, 64)
    validate_size(family_of(PipelineHandle.of(source=tiny("wan22-t2v-a14b"), model_class="WanPipeline")), 48, 64)


def test_a_mesh_gives_the_plan_its_layout(tiny):
    handle = PipelineHandle.of(source=tiny("flux1-schnell"), model_class="FluxPipeline")
    plan = plan_request(handle.replace(mesh=MeshSpec(chips=4, replicas=2)), request())
    assert plan.layout == (2, 1, 2) and plan.outputs == ("images", "latent")


def test_a_worker_rank_gets_the_clients_plan(tiny):
    start_image = np.random.default_rng(0).random((1, 64, 96, 3), dtype=np.float32)
    plan = plan_request(PipelineHandle.of(source=tiny("wan22-ti2v-5b"), model_class="WanPipeline"),
                        request(frames=5, width=0, height=0, images=(start_image,)))
    assert (plan.request.width, plan.request.height) == (96, 64)  # the size was resolved from the image
    data, payloads = plan.request.to_wire()
    on_rank = Plan.from_wire(json.loads(json.dumps(plan.to_wire())), SampleRequest.from_wire(data, payloads),
                             plan.device)
    assert dataclasses.replace(on_rank, request=plan.request) == plan  # the same family, task, pipeline, layout
    assert np.array_equal(on_rank.request.images[0], start_image)
    assert dataclasses.replace(on_rank.request, images=()) == dataclasses.replace(plan.request, images=())
    assert on_rank.task.name == "image2video" and on_rank.pipeline.cls == "WanImageToVideoPipeline"


def test_a_plan_made_before_the_settings_were_known_is_refined_once_loaded(tiny):
    """A hub model not yet downloaded: its settings are unknown when the plan is made (None), and the loaded
    pipeline's config decides; a plan whose settings were read is left as it is."""
    known = plan_request(PipelineHandle.of(source=tiny("wan22-ti2v-5b"), model_class="WanPipeline"),
                         request(frames=5))
    unknown = dataclasses.replace(known, settings=None, family=dataclasses.replace(known.family, size_multiple=16))
    refined = unknown.refined({"expand_timesteps": True, "_class_name": "WanPipeline"})
    assert refined.family.size_multiple == 32 and refined.settings is not None
    assert known.refined({}) is known


def test_run_info_comes_back_from_its_wire_form_with_its_tuples():
    info = RunInfo(device="cpu", mode="eager", task="text2image", pipeline="FluxPipeline", placement="device",
                   loaded=True, load_seconds=1.0, sample_seconds=2.0, mesh_shape=(2, 1, 2),
                   replica_ranks=((0, 1), (2, 3)), replica_images=(1, 1), notes=("a note",))
    wire = json.loads(json.dumps({**info.as_dict(), "rank_pids": [11, 12]}))
    assert RunInfo.from_wire(wire) == info
