"""Image to image and inpaint in a worker group: each pipeline skips the first steps by a rule of its own
(FLUX.1 runs 23 of 30 steps at denoise 0.75, SDXL 22), so the steps are counted as the pipeline runs them,
and rank 0 waits for each replica to say it is done, never for a step count."""

import pytest
import torch

from test_image_tasks import PIXELS, comfy_image, comfy_mask
from test_tensor_parallel import TP_VS_SINGLE_ATOL, handle_for, request

from tpu_diffusers_runtime.engine import Engine
from tpu_diffusers_runtime.specs import MeshSpec

TWO_REPLICAS = MeshSpec(chips=2, replicas=2)
# (steps, denoise) where the families' rules differ: 4 x 0.7 runs 3 steps on FLUX.1 and 2 on SDXL
GRID = [(4, 0.7), (3, 0.5)]
# every family with image to image, and SDXL's inpaint
CASES = [("flux1-schnell", "image2image"), ("sd3", "image2image"), ("qwenimage", "image2image"),
         ("sdxl", "image2image"), ("zimage", "image2image"), ("sdxl", "inpaint")]


@pytest.fixture(scope="module")
def group_engine():
    """One warm group of two replicas for the module; a miscount fails in a minute, not the default hour."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TPU_DIFFUSERS_WORKER_SILENCE_TIMEOUT", "60")
        engine = Engine()
        yield engine
        engine.unload()


def inputs(task: str, steps: int, denoise: float, batch_size: int = 2):
    image = dict(images=(comfy_image(PIXELS[0]),), denoise=denoise, steps=steps, batch_size=batch_size)
    return request(**image, **(dict(mask=comfy_mask()) if task == "inpaint" else {}))


def sampled(engine: Engine, handle, sample_request):
    """The images and the sampling progress reported, as (done, total) pairs."""
    seen = []

    def on_progress(done, total, what, *preview):
        if what == "sampling":
            seen.append((done, total))

    return engine.generate(handle, sample_request, on_progress=on_progress), seen


@pytest.mark.parametrize("steps, denoise", GRID)
@pytest.mark.parametrize("name, task", CASES)
def test_each_family_denoises_in_a_worker_group_as_in_this_process_and_counts_what_ran(
        tiny, group_engine, name, task, steps, denoise):
    sample_request = inputs(task, steps, denoise)
    here, here_steps = sampled(Engine(distribute=False), handle_for(tiny, name), sample_request)
    ran = len(here_steps)  # one progress call per step the pipeline ran
    assert here_steps[-1] == (ran, ran) and ran // 2 < steps  # two images; each skipped the first steps
    there, there_steps = sampled(group_engine, handle_for(tiny, name, mesh=TWO_REPLICAS), sample_request)
    assert there.info.task == task and there.info.replica_images == (1, 1)
    torch.testing.assert_close(there.images, here.images, atol=TP_VS_SINGLE_ATOL, rtol=0)
    assert there_steps[-1] == (ran, ran)  # both replicas' steps, as many as ran
    assert {total for _, total in there_steps} == {ran}


def test_sdxl_image_to_image_at_30_steps_and_denoise_0_75_runs_22_steps_per_image(tiny, group_engine):
    """The issue's case (it counted 23 steps per image, ran 22 and hung): an uneven split too, 2 images and 1."""
    sample_request = inputs("image2image", 30, 0.75, batch_size=3)
    result, seen = sampled(group_engine, handle_for(tiny, "sdxl", mesh=TWO_REPLICAS), sample_request)
    assert result.info.replica_images == (2, 1)
    assert seen[-1] == (3 * 22, 3 * 22) and {total for _, total in seen} == {3 * 22}
    here = Engine(distribute=False).generate(handle_for(tiny, "sdxl"), sample_request)
    torch.testing.assert_close(result.images, here.images, atol=TP_VS_SINGLE_ATOL, rtol=0)
