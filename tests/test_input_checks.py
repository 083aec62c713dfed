"""The Samplers' input checks exist once (runtime/input_checks.py): what a node refuses when the prompt is queued and
what the runtime refuses when it runs are the same words, and the queue-time rules follow the families."""

import numpy as np
import pytest

from tpu_diffusers_runtime import input_checks
from tpu_diffusers_runtime.errors import UserInputError
from tpu_diffusers_runtime.families import FAMILIES, family_for
from tpu_diffusers_runtime.tasks import SampleRequest, task_for

IMAGE = np.zeros((1, 64, 64, 3), np.float32)
MASK = np.zeros((1, 64, 64), np.float32)


def refusal(model_class: str, request: SampleRequest) -> str:
    family = family_for(model_class)
    task, pipeline = task_for(family, model_class, request)
    with pytest.raises(UserInputError) as refused:
        task.validate(family, pipeline, request)
    return str(refused.value)


@pytest.mark.parametrize("request_fields, queued", [
    (dict(mask=MASK, images=()), input_checks.image_inputs_problem((), mask=True)),
    (dict(denoise=0.5), input_checks.denoise_problem(0.5, has_image=False)),
    (dict(denoise=1.5, images=(IMAGE,)), input_checks.denoise_problem(1.5, has_image=True)),
])
def test_the_runtime_refuses_with_the_words_the_node_uses_when_queued(request_fields, queued):
    request = SampleRequest(prompt="a cat", width=64, height=64, **request_fields)
    assert queued and refusal("FluxPipeline", request) == queued


def test_the_family_rule_and_the_every_family_rule_are_one_check():
    flux = family_for("FluxPipeline")
    assert refusal("FluxPipeline", SampleRequest(prompt="a cat", width=1000, height=64)) == \
        input_checks.size_problem("width", 1000, flux)
    assert refusal("FluxPipeline", SampleRequest(prompt=" ", width=64, height=64)) == \
        input_checks.prompt_problem(" ", flux.name)
    every = input_checks.QUEUED_SIZE_MULTIPLE
    assert all(every % family.size_multiple == 0 or family.size_multiple % every == 0 for family in FAMILIES)
    assert input_checks.size_problem("width", every) is None
    assert "every supported model needs a multiple of" in input_checks.size_problem("width", every + 8)
    assert input_checks.queued_size_problem("width", 0, has_image=False).startswith("width 0 means the image's")
    assert input_checks.queued_size_problem("width", 0, has_image=True) is None


def test_the_queued_frame_rule_is_every_video_familys():
    wan = family_for("WanPipeline")
    assert input_checks.video_frame_factor() == wan.temporal_factor
    assert input_checks.frames_problem(81) is None and input_checks.frames_problem(81, wan) is None
    assert input_checks.frames_problem(8) == input_checks.frames_problem(8, wan).replace(wan.name, "the model")
