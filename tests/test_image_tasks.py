"""Image inputs (image to image, inpaint, edit): the task each model and input set runs, equal to plain diffusers
for the same inputs and seed (seed + i per image), on one loaded pipeline (from_pipe: nothing loads again)."""

import numpy as np
import pytest
import torch
from PIL import Image

from tpu_diffusers_runtime.engine import Engine
from tpu_diffusers_runtime.errors import UserInputError
from tpu_diffusers_runtime.families import family_for
from tpu_diffusers_runtime.handle import PipelineHandle
from tpu_diffusers_runtime.loading import inspect_source
from tpu_diffusers_runtime.specs import Placement
from tpu_diffusers_runtime.tasks import SampleRequest, resolve_size, task_for

PROMPT = "a cat sitting on a red chair"
RNG = np.random.default_rng(0)
PIXELS = [(RNG.random((80, 64, 3)) * 255).astype(np.uint8) for _ in range(3)]  # 8-bit images, as Load Image reads
MASK = np.zeros((80, 64), np.uint8)
MASK[20:60, 8:48] = 255


def comfy_image(*pixels):
    """ComfyUI's IMAGE from 8-bit pixels: float32 [N, H, W, 3] in 0..1."""
    return np.stack(pixels).astype(np.float32) / 255.0


def comfy_mask(mask=MASK):
    return (mask[None] / 255.0).astype(np.float32)


def reference(folder, cls, family, calls):
    """Plain diffusers: `cls` from the folder, one call per image (kwargs), as a [B, H, W, C] tensor."""
    import diffusers

    pipe = getattr(diffusers, cls).from_pretrained(folder, local_files_only=True)
    images = []
    for kwargs in calls:
        kwargs = {family.guidance_kwarg: 2.0, **kwargs}
        if family.takes_negative_prompt:
            kwargs["negative_prompt"] = " "
        images.append(pipe(prompt=PROMPT, height=64, width=64, num_inference_steps=4, output_type="pt",
                           **kwargs).images[:, :3].permute(0, 2, 3, 1))  # RGB, as IMAGE (Qwen-Image 2.1's is RGBA)
    return torch.cat(images)


def generator(seed):
    return torch.Generator("cpu").manual_seed(seed)


CASES = [  # (tiny model, diffusers class that runs, request inputs, the reference's image arguments per image i)
    ("flux1-schnell", "FluxImg2ImgPipeline", dict(images=(comfy_image(*PIXELS[:2]),), denoise=0.75),
     lambda i: dict(image=Image.fromarray(PIXELS[i]), strength=0.75)),
    ("flux1-dev", "FluxInpaintPipeline", dict(images=(comfy_image(PIXELS[0]),), mask=comfy_mask(), denoise=0.9),
     lambda i: dict(image=Image.fromarray(PIXELS[0]), mask_image=Image.fromarray(MASK, "L"), strength=0.9)),
    ("sd3", "StableDiffusion3Img2ImgPipeline", dict(images=(comfy_image(PIXELS[0]),), denoise=0.5),
     lambda i: dict(image=Image.fromarray(PIXELS[0]), strength=0.5)),
    ("sd3", "StableDiffusion3InpaintPipeline", dict(images=(comfy_image(PIXELS[0]),), mask=comfy_mask()),
     lambda i: dict(image=Image.fromarray(PIXELS[0]), mask_image=Image.fromarray(MASK, "L"), strength=1.0)),
    ("qwenimage", "QwenImageImg2ImgPipeline", dict(images=(comfy_image(PIXELS[1]),), denoise=0.6),
     lambda i: dict(image=Image.fromarray(PIXELS[1]), strength=0.6)),
    ("qwenimage", "QwenImageInpaintPipeline", dict(images=(comfy_image(PIXELS[1]),), mask=comfy_mask(), denoise=0.8),
     lambda i: dict(image=Image.fromarray(PIXELS[1]), mask_image=Image.fromarray(MASK, "L"), strength=0.8)),
    ("flux2", "Flux2Pipeline", dict(images=(comfy_image(PIXELS[0]), comfy_image(PIXELS[2]))),
     lambda i: dict(image=[Image.fromarray(PIXELS[0]), Image.fromarray(PIXELS[2])])),
    ("flux2-klein", "Flux2KleinPipeline", dict(images=(comfy_image(*PIXELS[:2]), comfy_image(PIXELS[2]))),
     lambda i: dict(image=[Image.fromarray(PIXELS[i]), Image.fromarray(PIXELS[2])])),
    # Klein's inpaint makes the image's own size: a 64x64 image for the 64x64 asked
    ("flux2-klein", "Flux2KleinInpaintPipeline", dict(images=(comfy_image(PIXELS[0][:64]), comfy_image(PIXELS[1])),
                                                      mask=comfy_mask(MASK[:64]), denoise=0.8),
     lambda i: dict(image=Image.fromarray(PIXELS[0][:64]), mask_image=Image.fromarray(MASK[:64], "L"),
                    image_reference=Image.fromarray(PIXELS[1]), strength=0.8)),
    ("sdxl", "StableDiffusionXLImg2ImgPipeline", dict(images=(comfy_image(PIXELS[2]),), denoise=0.7),
     lambda i: dict(image=Image.fromarray(PIXELS[2]), strength=0.7)),
    ("sdxl", "StableDiffusionXLInpaintPipeline", dict(images=(comfy_image(PIXELS[0]),), mask=comfy_mask(), denoise=0.9),
     lambda i: dict(image=Image.fromarray(PIXELS[0]), mask_image=Image.fromarray(MASK, "L"), strength=0.9)),
    # Z-Image's pipelines take the image at the output size (plain diffusers crashes on another): resized first
    ("zimage", "ZImageImg2ImgPipeline", dict(images=(comfy_image(PIXELS[2]),), denoise=0.7),
     lambda i: dict(image=Image.fromarray(PIXELS[2]).resize((64, 64), Image.LANCZOS), strength=0.7)),
    ("zimage", "ZImageInpaintPipeline", dict(images=(comfy_image(PIXELS[0]),), mask=comfy_mask(), denoise=0.85),
     lambda i: dict(image=Image.fromarray(PIXELS[0]).resize((64, 64), Image.LANCZOS),
                    mask_image=Image.fromarray(MASK, "L"), strength=0.85)),
    # Qwen-Image 2.1's edit: the references as a list (each resized by diffusers to ~1 MP), the asked size
    ("qwenimage21", "QwenImage21Pipeline", dict(images=(comfy_image(*PIXELS[:2]), comfy_image(PIXELS[2]))),
     lambda i: dict(image=[Image.fromarray(PIXELS[i]), Image.fromarray(PIXELS[2])])),
]


@pytest.mark.parametrize("name, cls, inputs, image_args", CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_each_task_equals_plain_diffusers_per_image_seed(tiny, name, cls, inputs, image_args):
    folder = tiny(name)
    handle = PipelineHandle.of(source=folder, model_class=inspect_source(folder))
    engine = Engine(distribute=False)
    result = engine.generate(handle, SampleRequest(prompt=PROMPT, width=64, height=64, steps=4, guidance=2.0, seed=11,
                                                   batch_size=2, **inputs))
    assert result.info.pipeline == cls
    family = family_for(handle.model_class)
    expected = reference(folder, cls, family, [dict(generator=generator(11 + i), **image_args(i)) for i in range(2)])
    assert torch.equal(result.images, expected)


def test_a_task_switch_on_a_loaded_model_loads_nothing_and_offload_follows_the_running_pipeline(tiny):
    folder = tiny("flux1-schnell")
    handle = PipelineHandle.of(source=folder, model_class="FluxPipeline", placement=Placement.MODEL_CPU_OFFLOAD)
    engine = Engine(distribute=False)
    ran = []
    for inputs in (dict(), dict(images=(comfy_image(PIXELS[0]),), denoise=0.5),
                   dict(images=(comfy_image(PIXELS[0]),), mask=comfy_mask()), dict()):
        info = engine.generate(handle, SampleRequest(prompt=PROMPT, width=64, height=64, steps=2, **inputs)).info
        ran.append((info.task, info.pipeline, info.loaded))
    assert ran == [("text2image", "FluxPipeline", True), ("image2image", "FluxImg2ImgPipeline", False),
                   ("inpaint", "FluxInpaintPipeline", False), ("text2image", "FluxPipeline", False)]
    assert engine.cache.stats.loads == 1
    entry = engine.realise(handle)[0]
    assert entry.hooked is entry.pipe  # the offload hooks went back with the text-to-image run
    assert all(not any(p.device.type != "cpu" for p in m.parameters())
               for m in entry.pipe.components.values() if isinstance(m, torch.nn.Module))


def test_qwen_image21_edits_with_the_text_to_image_pipeline_it_loaded(tiny):
    """Qwen-Image 2.1's text to image and edit are one diffusers class: switching between them loads nothing."""
    handle = PipelineHandle.of(source=tiny("qwenimage21"), model_class="QwenImage21Pipeline")
    engine = Engine(distribute=False)
    ran = [engine.generate(handle, SampleRequest(prompt=PROMPT, width=64, height=64, steps=1, **inputs)).info
           for inputs in (dict(), dict(images=(comfy_image(PIXELS[0]),)), dict())]
    assert [(info.task, info.pipeline, info.loaded) for info in ran] == [
        ("text2image", "QwenImage21Pipeline", True), ("edit", "QwenImage21Pipeline", False),
        ("text2image", "QwenImage21Pipeline", False)]
    assert engine.cache.stats.loads == 1


def test_size_zero_takes_the_image_size_rounded_to_the_family_multiple():
    family = family_for("FluxPipeline")
    pipeline = family.pipeline_for("FluxPipeline", "image2image")
    request = resolve_size(family, pipeline, SampleRequest(prompt=PROMPT, width=0, height=0,
                                                           images=(np.zeros((1, 70, 99, 3), np.float32),)))
    assert (request.width, request.height) == (96, 64)
    halves = resolve_size(family, pipeline, SampleRequest(prompt=PROMPT, width=0, height=0,
                                                          images=(np.zeros((1, 40, 88, 3), np.float32),)))
    assert (halves.width, halves.height) == (96, 48)  # exact halves round up, whatever the multiple's parity
    with pytest.raises(UserInputError, match="no image is connected"):
        resolve_size(family, pipeline, SampleRequest(prompt=PROMPT, width=0, height=64))


def test_a_pipeline_that_sets_its_own_size_takes_size_zero_or_that_size_only():
    family = family_for("QwenImageEditPipeline")
    pipeline = family.pipeline_for("QwenImageEditPipeline", "inpaint")  # ~1 MP at the image's aspect ratio
    image = np.zeros((1, 60, 80, 3), np.float32)
    assert resolve_size(family, pipeline, SampleRequest(prompt=PROMPT, width=0, height=0, images=(image,))).width \
        == 1184
    with pytest.raises(UserInputError, match="makes 1184x896 from this 80x60 image"):
        resolve_size(family, pipeline, SampleRequest(prompt=PROMPT, width=64, height=64, images=(image,)))
    klein = family_for("Flux2KleinPipeline")  # FLUX.2 [klein] inpaint: the image's size, rounded down to 16
    inpaint = klein.pipeline_for("Flux2KleinPipeline", "inpaint")
    assert (resolve_size(klein, inpaint, SampleRequest(prompt=PROMPT, width=0, height=0, images=(image,))).width,
            inpaint.output_size(2000, 1000)) == (80, (1440, 720))
    with pytest.raises(UserInputError, match=r"makes 80x48 from this 80x60 image \(the image's size, to 16 px"):
        resolve_size(klein, inpaint, SampleRequest(prompt=PROMPT, width=80, height=64, images=(image,)))


def test_the_request_travels_with_its_arrays_as_payloads_and_slices_keep_the_pairing():
    images = (comfy_image(*PIXELS), comfy_image(PIXELS[0]))
    request = SampleRequest(prompt=PROMPT, batch_size=5, seed=3, images=images, mask=comfy_mask(), denoise=0.5)
    data, payloads = request.to_wire()
    assert "images" not in data and len(payloads) == 3
    back = SampleRequest.from_wire(data, [bytes(p) for p in payloads])
    assert back == request and all(np.array_equal(a, b) for a, b in zip(back.images, images))
    assert np.array_equal(back.mask, request.mask)
    share = back.batch_slice(2, 2)
    assert (share.seed, share.batch_size, share.first_image) == (5, 2, 2)
    family = family_for("FluxPipeline")
    for model_inputs in (request, SampleRequest(prompt=PROMPT, batch_size=5, steps=4)):  # image / text task
        task, _ = task_for(family, "FluxPipeline", model_inputs)
        assert task.call_count(model_inputs.batch_slice(5, 0)) == 0  # a replica with no image makes no call


@pytest.mark.parametrize("model_class, inputs, message", [
    ("FluxPipeline", dict(mask=comfy_mask()), "a mask is connected but no image"),
    ("FluxPipeline", dict(denoise=0.5), "needs an image to start from"),
    ("FluxPipeline", dict(denoise=0.0, images=(comfy_image(PIXELS[0]),)), "above 0"),
    ("FluxPipeline", dict(images=(comfy_image(PIXELS[0]), comfy_image(PIXELS[1]))), "at most 1 image"),
    ("Flux2Pipeline", dict(images=(comfy_image(PIXELS[0]),), mask=comfy_mask()), "no inpaint pipeline"),
    ("Flux2Pipeline", dict(images=(comfy_image(PIXELS[0]),), denoise=0.5), "always denoises fully"),
    ("FluxFillPipeline", dict(), "has no text2image pipeline"),
    ("FluxFillPipeline", dict(images=(comfy_image(PIXELS[0]),)), "has no image2image pipeline"),
    ("QwenImageEditPipeline", dict(), "has no text2image pipeline"),
    ("QwenImageEditPlusPipeline", dict(images=(comfy_image(PIXELS[0]),) * 3 + (comfy_image(PIXELS[1]),)),
     "at most 3 image"),
    ("FluxPipeline", dict(images=(np.zeros((1, 8, 8, 2), np.float32),)), "3 channels"),
    ("FluxPipeline", dict(images=(comfy_image(PIXELS[0]),), mask=np.zeros((1, 1, 8, 8), np.float32)), "MASK is"),
])
def test_inputs_a_model_cannot_take_are_refused_before_anything_loads(model_class, inputs, message):
    family = family_for(model_class)
    request = SampleRequest(**{**dict(prompt=PROMPT, width=64, height=64), **inputs})
    with pytest.raises(UserInputError, match=message):
        task, pipeline = task_for(family, model_class, request)
        task.validate(family, pipeline, request)


def test_the_image_inputs_page_shows_the_task_matrix_of_the_families():
    from pathlib import Path

    from tpu_diffusers_runtime.tasks import markdown_matrix

    root = Path(__file__).resolve().parent.parent
    page = root / "docs" / "image_inputs.md"
    assert markdown_matrix() in page.read_text(), f"docs/image_inputs.md's task matrix differs from:\n{markdown_matrix()}"


def test_warm_up_sizes_can_name_the_size_of_the_images():
    from tpu_diffusers_runtime.features.compilation import parse_sizes
    from tpu_diffusers_runtime.tasks.images import resized

    assert parse_sizes("64x64, 96x64@128x96") == ((64, 64), (96, 64, 128, 96))
    with pytest.raises(UserInputError, match="IMAGEWIDTHxIMAGEHEIGHT"):
        parse_sizes("64x64@128")
    image = comfy_image(PIXELS[0])
    assert resized(image, (32, 40)).shape == (1, 40, 32, 3) and resized(image, None) is image


def test_an_edit_model_compiled_with_a_warm_up_at_its_reference_size_compiles_nothing_when_it_runs(tiny):
    from tpu_diffusers_runtime.specs import CompileSpec, ExecutionMode

    folder = tiny("flux2")
    handle = PipelineHandle.of(source=folder, model_class="Flux2Pipeline", mode=ExecutionMode.COMPILED,
                               compile=CompileSpec(scope="whole", warmup_sizes=((64, 64, 64, 80),)))
    engine = Engine(distribute=False)
    reference = RNG.random((1, 96, 64, 3), dtype=np.float32)  # 64x96: the warm-up resizes it to 64x80
    info = engine.generate(handle, SampleRequest(prompt=PROMPT, width=64, height=64, steps=2, seed=1,
                                                 images=(reference,))).info
    assert info.task == "edit" and any(n.startswith("warm-up: compiled now for 64x64") and n.endswith("images at 64x80")
                                       for n in info.notes), info.notes
    assert info.compiled_now is True  # the reference at its own size (64x96) is another transformer input shape
    again = engine.generate(handle, SampleRequest(prompt=PROMPT, width=64, height=64, steps=2, seed=2,
                                                  images=(comfy_image(PIXELS[1]),))).info  # 64x80, as warmed up
    assert again.compiled_now is False, again.notes


def test_a_lora_fused_on_the_loaded_model_serves_its_image_tasks_as_plain_diffusers_with_that_lora(tiny, tmp_path):
    import diffusers
    import tiny_loras

    from tpu_diffusers_runtime.specs import LoraSpec

    folder = tiny("flux1-schnell")
    lora = tiny_loras.build(folder, tmp_path / "style.safetensors", "diffusers", seed=4)
    handle = PipelineHandle.of(source=folder, model_class="FluxPipeline", loras=(LoraSpec(str(lora), 0.8),))
    engine = Engine(distribute=False)
    inputs = dict(images=(comfy_image(PIXELS[0]),), denoise=0.7)
    ours = engine.generate(handle, SampleRequest(prompt=PROMPT, width=64, height=64, steps=3, seed=2, **inputs))
    assert ours.info.pipeline == "FluxImg2ImgPipeline"
    pipe = diffusers.FluxImg2ImgPipeline.from_pretrained(folder, local_files_only=True)
    pipe.load_lora_weights(str(lora))
    pipe.fuse_lora(lora_scale=0.8)
    expected = pipe(prompt=PROMPT, image=Image.fromarray(PIXELS[0]), strength=0.7, height=64, width=64,
                    num_inference_steps=3, guidance_scale=0.0, generator=generator(2),
                    output_type="pt").images.permute(0, 2, 3, 1)
    assert (ours.images - expected).abs().max() < 1e-5
    base = engine.generate(handle.replace(loras=()), SampleRequest(prompt=PROMPT, width=64, height=64, steps=3,
                                                                   seed=2, **inputs))
    assert (base.images - ours.images).abs().max() > 1e-3 and not base.info.loaded  # the LoRA is off again


def test_progress_counts_every_image_call_and_each_step_has_its_preview(tiny):
    from tpu_diffusers_runtime.preview import PreviewSpec

    folder = tiny("flux1-schnell")
    handle = PipelineHandle.of(source=folder, model_class="FluxPipeline")
    seen = []
    spec = PreviewSpec(factors=tuple((0.1, 0.0, -0.1) for _ in range(16)))
    Engine(distribute=False).generate(
        handle, SampleRequest(prompt=PROMPT, width=64, height=64, steps=4, denoise=0.5, batch_size=2,
                              images=(comfy_image(PIXELS[0]),)),
        on_progress=lambda done, total, what, *preview: seen.append((done, total, what, preview)),
        preview=spec)
    sampling = [(done, total, preview[0].shape) for done, total, what, preview in seen if what == "sampling"]
    # denoise 0.5 of 4 steps runs 2 per image; 2 images, one call each
    assert sampling == [(1, 4, (8, 8, 3)), (2, 4, (8, 8, 3)), (3, 4, (8, 8, 3)), (4, 4, (8, 8, 3))]
