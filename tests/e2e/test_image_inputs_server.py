"""Image inputs through the real server: ComfyUI's own Load Image feeds the Sampler's image, image_2 and mask
(an RGBA PNG whose alpha hole is Load Image's mask), and the PNG that Save Image writes equals plain diffusers
for the same inputs and seed, computed here from the same tiny model folders: the PNG read by PIL as RGB, the
mask 1 - alpha / 255 as an 8-bit grey image (round(255 * m)), image i of a batch with seed + i, and the result
quantized as Save Image does (clip(255 * x, 0, 255) as uint8). A task switch on a loaded model loads nothing;
width/height 0 take the image's size; the run info names the task and the diffusers class."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

from comfy_host import PromptRejected
from serving import SAMPLER, run_info, run_ok, sampler_prompt

PROMPT = "a cat sitting on a red chair"
NEGATIVE = "blurry"
SEED = 21
# Load Image nodes (their outputs: 0 IMAGE, 1 MASK) and ComfyUI's Image Batch, beside the demo's nodes 1-4
LOAD_A, LOAD_B, LOAD_HOLE, LOAD_ODD, BATCH = "10", "11", "12", "13", "14"
FILES = {LOAD_A: "tpu_a.png", LOAD_B: "tpu_b.png", LOAD_HOLE: "tpu_hole.png", LOAD_ODD: "tpu_odd.png"}


def rgb(seed: int, height: int = 64, width: int = 64) -> np.ndarray:
    return (np.random.default_rng(seed).random((height, width, 3)) * 255).astype(np.uint8)


def with_hole(pixels: np.ndarray) -> np.ndarray:
    """RGBA: opaque, with a transparent hole (Load Image's mask 1 there: repaint) and a half-transparent rim."""
    alpha = np.full(pixels.shape[:2], 255, np.uint8)
    alpha[12:52, 16:48] = 128
    alpha[16:48, 20:44] = 0
    return np.dstack([pixels, alpha])


@pytest.fixture(scope="module")
def inputs(server) -> dict[str, object]:
    """The PNGs in the server's input folder (ComfyUI's --base-directory/input); returns each file's pixels as
    the pack gives them to diffusers: {node: PIL RGB image}, and "mask": the hole's mask as a PIL "L" image."""
    folder = server.base_dir / "input"
    folder.mkdir(exist_ok=True)
    arrays = {LOAD_A: rgb(1), LOAD_B: rgb(2), LOAD_HOLE: with_hole(rgb(3)), LOAD_ODD: rgb(4, height=45, width=75)}
    for node, array in arrays.items():
        Image.fromarray(array).save(folder / FILES[node])
    taken = {}
    for node in arrays:
        with Image.open(folder / FILES[node]) as image:
            taken[node] = image.convert("RGB")
    with Image.open(folder / FILES[LOAD_HOLE]) as image:
        mask = 1.0 - np.asarray(image.getchannel("A")).astype(np.float32) / 255.0  # Load Image's MASK
    taken["mask"] = Image.fromarray((np.clip(mask, 0, 1) * 255.0).round().astype(np.uint8), "L")
    return taken


def image_prompt(model: str, images=(), mask: str | None = None, batch=(), steps: int = 2, **sampler_inputs) -> dict:
    """The demo workflow on `model` with Load Image nodes linked in: `images` are the Load Image nodes for image,
    image_2, image_3 in order; `mask` the node whose MASK goes to mask; `batch` two nodes joined by Image Batch
    into `image` (a batch of 2)."""
    prompt = sampler_prompt(model, steps=steps, seed=SEED, prompt=PROMPT, **sampler_inputs)
    for node in {*images, *batch, *([mask] if mask else [])}:
        prompt[node] = {"class_type": "LoadImage", "inputs": {"image": FILES[node]}}
    for name, node in zip(("image", "image_2", "image_3"), images):
        prompt[SAMPLER]["inputs"][name] = [node, 0]
    if batch:
        prompt[BATCH] = {"class_type": "ImageBatch", "inputs": {"image1": [batch[0], 0], "image2": [batch[1], 0]}}
        prompt[SAMPLER]["inputs"]["image"] = [BATCH, 0]
    if mask:
        prompt[SAMPLER]["inputs"]["mask"] = [mask, 1]
    return prompt


def saved_pixels(server, entry) -> list[np.ndarray]:
    arrays = []
    for path in server.output_images(entry):
        with Image.open(path) as image:
            arrays.append(np.asarray(image.convert("RGB")))
    return arrays


_pipelines: dict = {}


def plain_diffusers(tiny, model: str, cls: str, calls: list[dict], **common) -> list[np.ndarray]:
    """Plain diffusers: `cls` from the tiny model's folder, one call per output image (batch 1, its own
    generator), quantized as Save Image does."""
    import diffusers

    key = (model, cls)
    if key not in _pipelines:
        pipe = getattr(diffusers, cls).from_pretrained(tiny(model), local_files_only=True)
        for component in pipe.components.values():
            if isinstance(component, torch.nn.Module):
                component.eval()
        _pipelines.clear()  # one at a time: the tests' memory stays small
        _pipelines[key] = pipe
    pipe = _pipelines[key]
    arrays = []
    for kwargs in calls:
        images = pipe(prompt=PROMPT, output_type="pt", **common, **kwargs).images  # [1, C, H, W] in 0..1
        rgb = images[:, :3]  # as IMAGE (Qwen-Image 2.1 decodes RGBA)
        arrays += list(np.clip(255.0 * rgb.permute(0, 2, 3, 1).float().numpy(), 0, 255).astype(np.uint8))
    return arrays


def generator(i: int = 0):
    return torch.Generator("cpu").manual_seed(SEED + i)


def assert_equal_images(ours: list[np.ndarray], theirs: list[np.ndarray]) -> None:
    assert len(ours) == len(theirs), (len(ours), len(theirs))
    for i, (a, b) in enumerate(zip(ours, theirs)):
        assert a.shape == b.shape, (i, a.shape, b.shape)
        differ = int((a != b).any(axis=-1).sum())
        most = np.abs(a.astype(int) - b).max()
        assert differ == 0, f"image {i}: {differ} pixels differ from plain diffusers (by up to {most})"


# (test id, tiny model, Load Image nodes for image/image_2, mask node, Sampler inputs, task, diffusers class,
#  the reference call's arguments for output image i (inputs: the pixels fixture))
CASES = [
    ("flux1-img2img-batch-2", "tiny-flux1-schnell", dict(batch=(LOAD_A, LOAD_B)),
     dict(denoise=0.6, batch_size=2, steps=4, guidance=0.0), "image2image", "FluxImg2ImgPipeline",
     lambda px, i: dict(image=px[(LOAD_A, LOAD_B)[i]], strength=0.6, guidance_scale=0.0)),
    ("flux1-inpaint-load-image-mask", "tiny-flux1-dev", dict(images=(LOAD_HOLE,), mask=LOAD_HOLE),
     dict(denoise=0.9, guidance=3.5), "inpaint", "FluxInpaintPipeline",
     lambda px, i: dict(image=px[LOAD_HOLE], mask_image=px["mask"], strength=0.9, guidance_scale=3.5)),
    ("sd3-img2img", "tiny-sd3", dict(images=(LOAD_A,)),
     dict(denoise=0.5, steps=4, guidance=2.0, negative_prompt=NEGATIVE), "image2image",
     "StableDiffusion3Img2ImgPipeline",
     lambda px, i: dict(image=px[LOAD_A], strength=0.5, guidance_scale=2.0, negative_prompt=NEGATIVE)),
    ("qwenimage-inpaint", "tiny-qwenimage", dict(images=(LOAD_HOLE,), mask=LOAD_HOLE),
     dict(denoise=0.8, guidance=2.0, negative_prompt=NEGATIVE), "inpaint", "QwenImageInpaintPipeline",
     lambda px, i: dict(image=px[LOAD_HOLE], mask_image=px["mask"], strength=0.8, true_cfg_scale=2.0,
                        negative_prompt=NEGATIVE)),
    ("flux2-two-references", "tiny-flux2", dict(images=(LOAD_A, LOAD_B)), dict(guidance=4.0), "edit",
     "Flux2Pipeline", lambda px, i: dict(image=[px[LOAD_A], px[LOAD_B]], guidance_scale=4.0)),
    # FLUX.2 [klein] 4B (distilled: its model_index's is_distilled turns CFG off whatever the guidance)
    ("flux2-klein-two-references", "tiny-flux2-klein", dict(images=(LOAD_A, LOAD_B)), dict(guidance=4.0, steps=4),
     "edit", "Flux2KleinPipeline", lambda px, i: dict(image=[px[LOAD_A], px[LOAD_B]], guidance_scale=4.0)),
    # Kontext returns ~1 MP whatever is asked unless max_area is width x height, which the pack passes
    ("kontext-edit", "tiny-flux1-kontext", dict(images=(LOAD_A,)), dict(guidance=2.5), "edit",
     "FluxKontextPipeline", lambda px, i: dict(image=px[LOAD_A], guidance_scale=2.5, max_area=64 * 64)),
    ("kontext-inpaint-with-reference", "tiny-flux1-kontext", dict(images=(LOAD_HOLE, LOAD_B), mask=LOAD_HOLE),
     dict(denoise=0.85, guidance=2.5), "inpaint", "FluxKontextInpaintPipeline",
     lambda px, i: dict(image=px[LOAD_HOLE], mask_image=px["mask"], image_reference=px[LOAD_B], strength=0.85,
                        guidance_scale=2.5, max_area=64 * 64)),
    ("fill", "tiny-flux1-fill", dict(images=(LOAD_HOLE,), mask=LOAD_HOLE), dict(guidance=30.0), "inpaint",
     "FluxFillPipeline", lambda px, i: dict(image=px[LOAD_HOLE], mask_image=px["mask"], strength=1.0,
                                            guidance_scale=30.0)),
    # one step, true CFG off (guidance 1): the edits' VAE encodes each image at ~1 MP, the costly part on CPU
    ("qwenimage-edit", "tiny-qwenimage-edit", dict(images=(LOAD_A,)),
     dict(guidance=1.0, negative_prompt=NEGATIVE, steps=1), "edit", "QwenImageEditPipeline",
     lambda px, i: dict(image=px[LOAD_A], true_cfg_scale=1.0, negative_prompt=NEGATIVE)),
    ("qwenimage-edit-plus-two-images", "tiny-qwenimage-edit-plus", dict(images=(LOAD_A, LOAD_B)),
     dict(guidance=1.0, negative_prompt=NEGATIVE, steps=1), "edit", "QwenImageEditPlusPipeline",
     lambda px, i: dict(image=[px[LOAD_A], px[LOAD_B]], true_cfg_scale=1.0, negative_prompt=NEGATIVE)),
    ("qwenimage21-edit-two-references", "tiny-qwenimage21", dict(images=(LOAD_A, LOAD_B)),
     dict(guidance=1.0, negative_prompt=NEGATIVE, steps=1), "edit", "QwenImage21Pipeline",
     lambda px, i: dict(image=[px[LOAD_A], px[LOAD_B]], true_cfg_scale=1.0, negative_prompt=NEGATIVE)),
    # Z-Image's pipelines take the image at the output size (plain diffusers crashes on another): the pack resizes
    # the 75x45 picture to 64x64 with Lanczos first, so plain diffusers gets it resized so
    ("zimage-img2img-resized", "tiny-zimage", dict(images=(LOAD_ODD,)), dict(denoise=0.6, steps=4, guidance=0.0),
     "image2image", "ZImageImg2ImgPipeline",
     lambda px, i: dict(image=px[LOAD_ODD].resize((64, 64), Image.LANCZOS), strength=0.6, guidance_scale=0.0)),
]


@pytest.mark.parametrize("model, links, sampler_inputs, task, cls, reference_args", [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_each_task_saves_what_plain_diffusers_gives_for_the_same_inputs_and_seed(
        server, inputs, tiny, model, links, sampler_inputs, task, cls, reference_args):
    entry = run_ok(server, image_prompt(model, **links, **sampler_inputs))
    info = run_info(entry)
    assert (info["task"], info["pipeline"]) == (task, cls), info
    steps = sampler_inputs.get("steps", 2)
    calls = [dict(generator=generator(i), **reference_args(inputs, i))
             for i in range(sampler_inputs.get("batch_size", 1))]
    expected = plain_diffusers(tiny, model.removeprefix("tiny-"), cls, calls, height=64, width=64,
                               num_inference_steps=steps)
    assert_equal_images(saved_pixels(server, entry), expected)


def test_a_task_switch_on_the_loaded_model_loads_nothing_and_the_run_info_names_task_and_class(server, inputs):
    """The same Loader, Mode Selector and model: text to image, then image to image, inpaint, and text to image
    again reuse the one loaded pipeline (from_pipe makes the task pipelines of its components)."""
    ran = []
    for i, links in enumerate([dict(), dict(images=(LOAD_A,), denoise=0.5), dict(images=(LOAD_HOLE,), mask=LOAD_HOLE),
                               dict()]):
        prompt = image_prompt("tiny-flux1-dev", **links)
        prompt[SAMPLER]["inputs"]["seed"] = SEED + 100 + i  # a new seed each time: ComfyUI runs the Sampler again
        info = run_info(run_ok(server, prompt))
        ran.append((info["task"], info["pipeline"], info["loaded"]))
    assert [(task, cls) for task, cls, _ in ran] == [
        ("text2image", "FluxPipeline"), ("image2image", "FluxImg2ImgPipeline"), ("inpaint", "FluxInpaintPipeline"),
        ("text2image", "FluxPipeline")]
    assert [loaded for _, _, loaded in ran[1:]] == [False, False, False], ran


def test_width_and_height_0_take_the_images_size_rounded_to_16(server, inputs, tiny):
    """A 75x45 image: 0 x 0 runs at 80x48 (75 / 16 = 4.7 -> 5, 45 / 16 = 2.8 -> 3), the image resized to it by
    diffusers as for any size; the saved image equals plain diffusers asked for 80x48."""
    prompt = image_prompt("tiny-flux1-schnell", images=(LOAD_ODD,), width=0, height=0, denoise=0.7, steps=3,
                          guidance=0.0)
    entry = run_ok(server, prompt)
    assert run_info(entry)["task"] == "image2image"
    [saved] = saved_pixels(server, entry)
    assert saved.shape == (48, 80, 3)
    expected = plain_diffusers(tiny, "flux1-schnell", "FluxImg2ImgPipeline",
                               [dict(generator=generator(), image=inputs[LOAD_ODD], strength=0.7, guidance_scale=0.0)],
                               width=80, height=48, num_inference_steps=3)
    assert_equal_images([saved], expected)
    prompt[SAMPLER]["inputs"].update(width=64, seed=SEED + 1)  # one of them 0: the other as given
    assert saved_pixels(server, run_ok(server, prompt))[0].shape == (48, 64, 3)


def flux3_blocks(tiny, model: str, upsample: bool, guidance: float | None, calls: list[dict]) -> list[np.ndarray]:
    """FLUX 3 [klein] run as a diffusers user sets its modular blocks up from the folder: the prompt upsampler step
    popped when it is not wanted, the base model's CFG set on its guider; quantized as Save Image does."""
    from diffusers import ClassifierFreeGuidance
    from diffusers.modular_pipelines import Flux3AutoBlocks, Flux3DistilledAutoBlocks

    blocks = (Flux3AutoBlocks if guidance is not None else Flux3DistilledAutoBlocks)()
    if not upsample:
        blocks.sub_blocks.pop("prompt_upsampler")
    pipe = blocks.init_pipeline(tiny(model))
    pipe.load_components(torch_dtype=torch.float32)
    if guidance is not None:
        pipe.update_components(guider=ClassifierFreeGuidance(guidance_scale=guidance))
    arrays = []
    for kwargs in calls:
        images = pipe(prompt=PROMPT, output_type="pt", output="images", **kwargs)
        arrays += list(np.clip(255.0 * images.permute(0, 2, 3, 1).float().numpy(), 0, 255).astype(np.uint8))
    return arrays


def test_flux3_klein_text_to_image_and_edits_save_what_its_modular_blocks_give(server, inputs, tiny):
    """FLUX 3 [klein] (modular blocks only): the base model's text to image with CFG and its prompt upsampler (on
    by default), then an edit from two Load Images, then the same edit with prompt_upsampling off, each equal to
    diffusers' blocks set up as their docs say; the switches load nothing. The distilled model's edit takes no
    guidance or negative prompt (the run says it ignored it)."""
    sizes = dict(width=64, height=48)
    ran = []
    for i, (links, upsample) in enumerate([((), True), ((LOAD_A, LOAD_B), True), ((LOAD_A, LOAD_B), False)]):
        prompt = image_prompt("tiny-flux3", images=links, guidance=2.5, negative_prompt=NEGATIVE,
                              prompt_upsampling=upsample, **sizes)
        prompt[SAMPLER]["inputs"]["seed"] = SEED + i
        entry = run_ok(server, prompt)
        info = run_info(entry)
        ran.append((info["task"], info["pipeline"], info["loaded"]))
        assert ("prompt rewritten first by the model's prompt upsampler (prompt_upsampling on)" in info["notes"]) \
            == upsample
        references = dict(image=[inputs[LOAD_A], inputs[LOAD_B]]) if links else {}
        expected = flux3_blocks(tiny, "flux3", upsample, 2.5, [dict(
            generator=generator(i), negative_prompt=NEGATIVE, num_inference_steps=2, **sizes, **references)])
        assert_equal_images(saved_pixels(server, entry), expected)
    assert ran == [("text2image", "Flux3ModularPipeline", True), ("edit", "Flux3ModularPipeline", False),
                   ("edit", "Flux3ModularPipeline", False)]

    entry = run_ok(server, image_prompt("tiny-flux3-distilled", images=(LOAD_A,), guidance=4.0,
                                        negative_prompt=NEGATIVE, prompt_upsampling=False, **sizes))
    info = run_info(entry)
    assert (info["task"], info["pipeline"]) == ("edit", "Flux3DistilledModularPipeline")
    assert "negative prompt ignored: FLUX 3 [klein] (Flux3DistilledModularPipeline) takes none" in info["notes"]
    expected = flux3_blocks(tiny, "flux3-distilled", False, None, [dict(
        generator=generator(), num_inference_steps=2, image=[inputs[LOAD_A]], **sizes)])
    assert_equal_images(saved_pixels(server, entry), expected)

    with pytest.raises(PromptRejected) as rejected:  # a size it cannot make: refused when queued
        server.queue(image_prompt("tiny-flux3", width=72, height=48))
    message = json.dumps(rejected.value.body)
    assert "width 72 cannot be used" in message and "Nearest valid widths: 64 or 80" in message, message
