"""Bad input through the real server: each gives a clear error on the node it concerns (refused when
queued, HTTP 400 naming the node, or failed when that node runs), and the server then runs a good
prompt. Nothing is retried, nothing is left half-done.

Counted in the report: "bad inputs tried" (every case run) and "bad inputs refused clearly"; the image
inputs that are odd but taken (a mask of another size or batch, an RGBA or grey image) as "image inputs
taken as documented, with their note".
"""

from __future__ import annotations

import concurrent.futures
import shutil
import threading

import numpy as np
import pytest
from PIL import Image

from harness import count, inductor_cache, start_server
from serving import (COMPILE, LOADER, MESH, MODE, SAMPLER, a_good_prompt_succeeds, clear_error, failure,
                     image_sizes, outcome, run_info, run_ok, sampler_prompt, with_compile, with_mesh)

FLUX = "tiny-flux1-schnell"
UNUSED_KEY = "ab" * 32  # well-formed, matches no worker group (and refused when a workflow types it)


def edited(node: str, **inputs):
    """A prompt builder: the small FLUX.1 prompt with some inputs of one node replaced."""
    def build(server):
        prompt = sampler_prompt(FLUX)
        prompt[node]["inputs"].update(inputs)
        return prompt
    return build


def image_edge_into_the_mode_selector(server):
    prompt = sampler_prompt(FLUX)
    prompt["7"] = {"class_type": "EmptyImage", "inputs": {"width": 64, "height": 64, "batch_size": 1, "color": 0}}
    prompt[MODE]["inputs"]["pipeline"] = ["7", 0]
    return prompt


def without_the_pipeline_input(server):
    prompt = sampler_prompt(FLUX)
    del prompt[SAMPLER]["inputs"]["pipeline"]
    return prompt


def compiled(**options):
    return lambda server: with_compile(sampler_prompt(FLUX, mode="compiled"), server, **options)


def meshed(model=FLUX, placement="device", **options):
    return lambda server: with_mesh(sampler_prompt(model, placement=placement), **options)


def case(name, build, nodes, says):
    """One bad input: a prompt builder, the nodes the error may be on, what the message must say (regexes)."""
    return pytest.param(build, (nodes,) if isinstance(nodes, str) else nodes, says, id=name)


CASES = [
    # sizes, prompt, steps, guidance, seed: the Sampler
    case("width-not-a-multiple-of-16", edited(SAMPLER, width=1000), SAMPLER, ["width", "multiple of 16"]),
    case("height-not-a-multiple-of-16", edited(SAMPLER, height=72), SAMPLER, ["height", "multiple of 16"]),
    case("empty-prompt", edited(SAMPLER, prompt=""), SAMPLER, ["prompt"]),
    case("blank-prompt", edited(SAMPLER, prompt="  \n "), SAMPLER, ["prompt"]),
    case("huge-width", edited(SAMPLER, width=100_000), SAMPLER, ["width", "8192|100000"]),
    case("huge-height", edited(SAMPLER, height=65_536), SAMPLER, ["height", "8192|65536"]),
    case("zero-steps", edited(SAMPLER, steps=0), SAMPLER, ["steps"]),
    case("negative-guidance", edited(SAMPLER, guidance=-1.0), SAMPLER, ["guidance"]),
    case("negative-seed", edited(SAMPLER, seed=-1), SAMPLER, ["seed"]),
    case("nan-seed", edited(SAMPLER, seed=float("nan")), SAMPLER, ["seed"]),
    case("string-width", edited(SAMPLER, width="wide"), SAMPLER, ["width"]),
    # wrong edges in the prompt JSON
    case("image-edge-where-a-pipeline-belongs", image_edge_into_the_mode_selector, MODE, ["pipeline", "IMAGE"]),
    case("pipeline-input-missing", without_the_pipeline_input, SAMPLER, ["pipeline"]),
    # the Loader
    case("model-folder-missing", edited(LOADER, model="does-not-exist"), LOADER, ["does-not-exist"]),
    case("model-name-escaping-the-model-folders", edited(LOADER, model="../tiny-sd3"), LOADER, ["tiny-sd3"]),
    case("folder-without-pipeline-class", edited(LOADER, model="not-a-pipeline"), LOADER, ["pipeline class"]),
    case("unsupported-pipeline-class", edited(LOADER, model="unsupported-sd15"), LOADER, ["StableDiffusionPipeline"]),
    case("truncated-weights-file", edited(LOADER, model="corrupt-flux"), LOADER, ["truncated or corrupt"]),
    case("hub-id-not-owner-slash-name", edited(LOADER, hub_id="not a hub id"), LOADER, ["hub id"]),
    case("hub-id-that-is-a-path", edited(LOADER, hub_id="../../../../etc"), LOADER, ["hub id"]),
    case("hub-id-offline", edited(LOADER, hub_id="black-forest-labs/FLUX.1-schnell"), LOADER, ["download"]),
    case("unknown-dtype", edited(LOADER, dtype="int8"), LOADER, ["int8"]),
    case("unknown-device", edited(LOADER, device="quantum"), LOADER, ["quantum"]),
    # the Mode Selector
    case("unknown-mode", edited(MODE, mode="turbo"), MODE, ["turbo"]),
    case("unknown-placement", edited(MODE, placement="everywhere"), MODE, ["everywhere"]),
    # the Compile Transformer
    case("warmup-size-not-widthxheight", compiled(warmup_sizes="1024 by 1024"), COMPILE, ["WIDTHxHEIGHT"]),
    case("warmup-size-not-a-multiple-of-16", compiled(warmup_sizes="1000x1000"), COMPILE, ["multiple of 16"]),
    case("unknown-compile-scope", compiled(scope="everything"), (COMPILE, SAMPLER), ["scope", "everything"]),
    # the TP Mesh
    case("attach-address-not-host-port", meshed(workers="attach", address="nohost"), MESH, ["address", "host:port"]),
    case("attach-key-typed-in-the-workflow", meshed(workers="attach", address="127.0.0.1:9", key=UNUSED_KEY), MESH,
         ["key", "TPU_DIFFUSERS_CONTROL_KEY"]),
    case("attach-address-not-allowed", meshed(workers="attach", address="10.0.0.2:9"), MESH,
         ["10.0.0.2:9", "TPU_DIFFUSERS_ATTACH_ALLOW"]),
    case("attach-where-nothing-listens", meshed(workers="attach", address="127.0.0.1:9"), (MESH, SAMPLER),
         ["127.0.0.1:9"]),
    case("unknown-workers-kind", meshed(workers="cloud"), MESH, ["workers", "cloud"]),
    case("more-chips-than-the-host-has", meshed(chips=64), (MESH, SAMPLER), ["64", "chips"]),
    case("tp-for-a-model-without-a-tp-plan", meshed(model="tiny-sd3"), (MESH, SAMPLER), ["SD3", "plan"]),
    case("tp-with-model-cpu-offload", meshed(placement="model_cpu_offload"), (MODE, MESH, SAMPLER),
         ["placement|offload"]),
]


# --- image inputs: ComfyUI's Load Image (and Image Batch, Solid Mask, ...) into the Sampler's image, image_2,
# image_3 and mask. Node ids of the image nodes below, beside the demo's 1-4.
PNG_A, PNG_B, PNG_HOLE = "bad_input_a.png", "bad_input_b.png", "bad_input_hole.png"
A, B, HOLE, TEXT, FLOAT, INT, SMALL_MASK, BATCH_AB, MASKS, RGBA, TWO_CHANNELS, GREY, FIVE_CHANNELS = (
    "10", "11", "12", "13", "14", "15", "16", "17", "18", "19", "20", "21", "22")
IMAGE_NODES = {
    A: {"class_type": "LoadImage", "inputs": {"image": PNG_A}},
    B: {"class_type": "LoadImage", "inputs": {"image": PNG_B}},
    HOLE: {"class_type": "LoadImage", "inputs": {"image": PNG_HOLE}},  # RGBA: its MASK (output 1) is the hole
    TEXT: {"class_type": "PrimitiveString", "inputs": {"value": "not an image"}},
    FLOAT: {"class_type": "PrimitiveFloat", "inputs": {"value": 1.5}},
    INT: {"class_type": "PrimitiveInt", "inputs": {"value": 0}},
    SMALL_MASK: {"class_type": "SolidMask", "inputs": {"value": 1.0, "width": 32, "height": 48}},
    BATCH_AB: {"class_type": "ImageBatch", "inputs": {"image1": [A, 0], "image2": [B, 0]}},
    MASKS: {"class_type": "ImageToMask", "inputs": {"image": [BATCH_AB, 0], "channel": "red"}},  # a batch of 2
    RGBA: {"class_type": "JoinImageWithAlpha", "inputs": {"image": [A, 0], "alpha": [HOLE, 1]}},
    # harness.py's test-only node: ComfyUI's own nodes make no IMAGE of 1, 2 or 5 channels
    TWO_CHANNELS: {"class_type": "TestImageOfShape", "inputs": {"channels": 2, "width": 64, "height": 64,
                                                                "batch_size": 1}},
    GREY: {"class_type": "TestImageOfShape", "inputs": {"channels": 1, "width": 64, "height": 64, "batch_size": 1}},
    FIVE_CHANNELS: {"class_type": "TestImageOfShape", "inputs": {"channels": 5, "width": 64, "height": 64,
                                                                 "batch_size": 1}},
}


def write_input_images(server) -> None:
    """The PNGs the Load Image nodes read, in the server's input folder (written once)."""
    folder = server.base_dir / "input"
    folder.mkdir(exist_ok=True)
    rng = np.random.default_rng(5)
    if not (folder / PNG_HOLE).exists():
        pixels = (rng.random((3, 64, 64, 3)) * 255).astype(np.uint8)
        alpha = np.full((64, 64), 255, np.uint8)
        alpha[16:48, 16:48] = 0
        Image.fromarray(pixels[0]).save(folder / PNG_A)
        Image.fromarray(pixels[1]).save(folder / PNG_B)
        Image.fromarray(np.dstack([pixels[2], alpha])).save(folder / PNG_HOLE)


def linked(model=FLUX, links: dict | None = None, **sampler_inputs):
    """A prompt builder: the small prompt on `model` with Sampler inputs linked to image nodes,
    links = {input: (node, output)}; the nodes those need come along."""
    def build(server):
        write_input_images(server)
        prompt = sampler_prompt(model, **sampler_inputs)

        def add(node):
            if node not in prompt:
                prompt[node] = dict(IMAGE_NODES[node], inputs=dict(IMAGE_NODES[node]["inputs"]))
                for value in prompt[node]["inputs"].values():
                    if isinstance(value, list):
                        add(value[0])

        for name, (node, output) in (links or {}).items():
            add(node)
            prompt[SAMPLER]["inputs"][name] = [node, output]
        return prompt
    return build


IMAGE_A, IMAGE_B, HOLE_IMAGE, HOLE_MASK = (A, 0), (B, 0), (HOLE, 0), (HOLE, 1)
KONTEXT, FILL, FLUX2, SD3 = "tiny-flux1-kontext", "tiny-flux1-fill", "tiny-flux2", "tiny-sd3"
QWEN_EDIT, QWEN_EDIT_PLUS = "tiny-qwenimage-edit", "tiny-qwenimage-edit-plus"

IMAGE_CASES = [
    # refused when queued, from the links alone (the Sampler's validate_inputs)
    case("mask-without-image", linked(links={"mask": HOLE_MASK}), SAMPLER, ["mask", "no image", "connect the image"]),
    case("image_2-without-image", linked(links={"image_2": IMAGE_A}), SAMPLER, ["image_2", "image first"]),
    case("image_3-without-image_2", linked(links={"image": IMAGE_A, "image_3": IMAGE_B}), SAMPLER,
         ["image_3", "image_2 first"]),
    case("denoise-0", linked(links={"image": IMAGE_A}, denoise=0.0), SAMPLER, ["denoise 0", "above 0"]),
    case("denoise-1.5", linked(links={"image": IMAGE_A}, denoise=1.5), SAMPLER, ["denoise 1.5", "at most 1"]),
    case("denoise-negative", linked(links={"image": IMAGE_A}, denoise=-0.5), SAMPLER, ["denoise -0.5", "above 0"]),
    case("denoise-below-1-without-image", linked(denoise=0.5), SAMPLER,
         ["denoise 0.5", "needs an image", "set denoise to 1"]),
    case("width-0-without-image", linked(width=0), SAMPLER, ["width 0", "no image is connected", "set width"]),
    case("height-0-without-image", linked(height=0), SAMPLER, ["height 0", "no image is connected", "set height"]),
    case("string-link-into-image", linked(links={"image": (TEXT, 0)}), SAMPLER,
         ["image takes IMAGE", "a STRING output"]),
    case("image-link-into-mask", linked(links={"image": IMAGE_A, "mask": IMAGE_B}), SAMPLER,
         ["mask takes MASK", "an IMAGE output"]),
    case("mask-link-into-image", linked(links={"image": HOLE_MASK}), SAMPLER, ["image takes IMAGE", "a MASK output"]),
    case("image-link-into-prompt", linked(links={"prompt": IMAGE_A}), SAMPLER,
         ["prompt takes STRING", "an IMAGE output"]),
    # refused when the Sampler runs, before anything loads: what the model takes
    case("two-images-into-flux1-image-to-image", linked(links={"image": IMAGE_A, "image_2": IMAGE_B}), SAMPLER,
         ["FluxImg2ImgPipeline takes at most 1 image", "disconnect image_2"]),
    case("two-images-into-sd3-image-to-image", linked(SD3, links={"image": IMAGE_A, "image_2": IMAGE_B}), SAMPLER,
         ["StableDiffusion3Img2ImgPipeline takes at most 1 image", "disconnect image_2"]),
    case("two-images-into-kontext-edit", linked(KONTEXT, links={"image": IMAGE_A, "image_2": IMAGE_B}), SAMPLER,
         ["FluxKontextPipeline takes at most 1 image", "disconnect image_2"]),
    case("three-images-into-kontext-inpaint", linked(KONTEXT, links={
        "image": HOLE_IMAGE, "image_2": IMAGE_A, "image_3": IMAGE_B, "mask": HOLE_MASK}), SAMPLER,
         ["FluxKontextInpaintPipeline takes at most 2 image", "disconnect image_3"]),
    case("two-images-into-qwen-image-edit", linked(QWEN_EDIT, links={"image": IMAGE_A, "image_2": IMAGE_B}),
         SAMPLER, ["QwenImageEditPipeline takes at most 1 image", "disconnect image_2"]),
    case("mask-on-flux2", linked(FLUX2, links={"image": HOLE_IMAGE, "mask": HOLE_MASK}), SAMPLER,
         ["no inpaint pipeline", "edit with 1 to 3 images", "disconnect"]),
    case("denoise-0.5-on-flux2-edit", linked(FLUX2, links={"image": IMAGE_A}, denoise=0.5), SAMPLER,
         ["Flux2Pipeline always denoises fully", "set denoise to 1"]),
    case("denoise-0.5-on-kontext-edit", linked(KONTEXT, links={"image": IMAGE_A}, denoise=0.5), SAMPLER,
         ["FluxKontextPipeline always denoises fully", "set denoise to 1"]),
    case("denoise-0.5-on-qwen-image-edit-plus", linked(QWEN_EDIT_PLUS, links={"image": IMAGE_A}, denoise=0.5),
         SAMPLER, ["QwenImageEditPlusPipeline always denoises fully", "set denoise to 1"]),
    case("qwen-image-edit-without-image", linked(QWEN_EDIT), SAMPLER,
         ["no text2image pipeline", "no image is connected", "edit with an image"]),
    case("qwen-image-edit-plus-without-image", linked(QWEN_EDIT_PLUS), SAMPLER,
         ["no text2image pipeline", "edit with 1 to 3 images"]),
    case("fill-without-image-or-mask", linked(FILL), SAMPLER,
         ["FluxFillPipeline has no text2image pipeline", r"inpaint with image \+ mask"]),
    case("fill-with-image-but-no-mask", linked(FILL, links={"image": IMAGE_A}), SAMPLER,
         ["has no image2image pipeline", r"image \+ mask", "mask"]),
    case("denoise-1.5-from-a-link", linked(links={"image": IMAGE_A, "denoise": (FLOAT, 0)}), SAMPLER,
         ["denoise 1.5", "at most 1"]),
    case("width-0-from-a-link-without-image", linked(links={"width": (INT, 0)}), SAMPLER,
         ["width or height is 0", "no image is connected", "set the size"]),
    case("two-channel-image", linked(links={"image": (TWO_CHANNELS, 0)}), SAMPLER,
         [r"image has shape \[1, 64, 64, 2\]", "3 channels"]),
    case("five-channel-image_2-into-flux2", linked(FLUX2, links={"image": IMAGE_A, "image_2": (FIVE_CHANNELS, 0)}),
         SAMPLER, [r"image_2 has shape \[1, 64, 64, 5\]", "3 channels"]),
]


@pytest.mark.parametrize("build, nodes, says", IMAGE_CASES)
def test_bad_image_input_is_a_clear_error_on_the_sampler_then_a_good_prompt_runs(server, request, build, nodes,
                                                                                  says):
    count("bad inputs tried")
    message = clear_error(server, build(server), nodes, *says)
    print(f"\n[bad input] {request.node.callspec.id}: {message.strip()[:200]}")
    count("bad inputs refused clearly")
    a_good_prompt_succeeds(server)


@pytest.mark.parametrize("build, batch, note", [
    pytest.param(linked(links={"image": IMAGE_A, "mask": (SMALL_MASK, 0)}), 1,
                 "mask resized from 32x48 to the image's 64x64", id="mask-of-another-size-is-resized"),
    pytest.param(linked(links={"image": IMAGE_A, "mask": (MASKS, 0)}, batch_size=2), 2,
                 "mask: a batch of 2; output image i uses mask i % 2", id="mask-batch-of-2-for-one-image"),
    pytest.param(linked(links={"image": (BATCH_AB, 0)}, batch_size=3), 3,
                 "image: a batch of 2; output image i uses its image i % 2", id="image-batch-of-2-for-batch-3"),
    pytest.param(linked(links={"image": (RGBA, 0)}), 1, "image: alpha channel dropped (RGBA -> RGB)",
                 id="rgba-image-drops-alpha"),
    pytest.param(linked(links={"image": (GREY, 0)}), 1, None, id="grey-one-channel-image"),
])
def test_an_odd_image_input_is_taken_as_documented_and_the_run_info_says_how(server, request, build, batch, note):
    """Not errors: a mask is resized to its image, a batch of images or masks pairs item i % N with output
    image i, RGBA loses its alpha, one channel is grey; the run info's notes say so."""
    entry = run_ok(server, build(server))
    info = run_info(entry)
    print(f"\n[image input] {request.node.callspec.id}: {info['task']} ({info['pipeline']}), notes {info['notes']}")
    assert image_sizes(server, entry) == [(64, 64)] * batch
    assert info["task"] == ("inpaint" if "mask" in request.node.callspec.id else "image2image"), info
    if note:
        assert any(said.startswith(note) for said in info["notes"]), info["notes"]
    count("image inputs taken as documented, with their note")


@pytest.mark.parametrize("build, nodes, says", CASES)
def test_bad_input_is_a_clear_error_on_its_node_then_a_good_prompt_runs(server, request, build, nodes, says):
    count("bad inputs tried")
    message = clear_error(server, build(server), nodes, *says)
    print(f"\n[bad input] {request.node.callspec.id}: {message.strip()[:200]}")
    count("bad inputs refused clearly")
    a_good_prompt_succeeds(server)


def test_at_least_25_distinct_bad_inputs_are_tried():
    """The table above and the tests below it (the batch, the deleted folders, the compile cache twice,
    two clients) are the suite's bad inputs: at least 25, each different; and at least 20 of the image
    inputs (IMAGE_CASES)."""
    ids = [param.id for param in CASES + IMAGE_CASES]
    assert len(set(ids)) == len(ids) and len(ids) + 6 >= 25
    assert len(IMAGE_CASES) >= 20


def test_batch_64_at_the_largest_size_is_refused_before_memory_is_taken(server):
    count("bad inputs tried")
    peak_before = server.peak_rss_bytes()
    message = clear_error(server, sampler_prompt(FLUX, width=8192, height=8192, batch_size=64), SAMPLER,
                          "memory|too large")
    grown = server.peak_rss_bytes() - peak_before
    print(f"\n[bad input] batch 64 at 8192x8192: peak RSS grew {grown / 2**20:.0f} MiB: {message.strip()[:200]}")
    assert grown < 512 * 2**20, f"the server took {grown / 2**30:.1f} GiB before refusing"
    count("bad inputs refused clearly")
    a_good_prompt_succeeds(server)


def test_model_folder_deleted_while_the_sampler_loads_it(server):
    """The Loader checked the folder; it disappears once the Sampler has begun loading it."""
    count("bad inputs tried")
    folder = server.models_dir / "diffusers" / "vanishing-flux"
    shutil.copytree(server.models_dir / "diffusers" / "tiny-flux1-dev", folder, symlinks=False)
    run_ok(server, sampler_prompt("tiny-sd3"))  # so the copy is not the pipeline already loaded
    with server.events() as events:
        prompt_id = server.queue(sampler_prompt("vanishing-flux", steps=5), client_id=events.client_id)
        events.wait_for(lambda m: m["type"] == "progress" and m["data"]["prompt_id"] == prompt_id, timeout=120)
        shutil.rmtree(folder)  # the first progress of the Sampler: loading component 1 of 8
        entry = server.wait(prompt_id, timeout=300)
    node, message = failure(entry)
    assert node == SAMPLER and "vanishing-flux" in message, message
    print(f"\n[bad input] model folder deleted while loading: {message.strip()[:200]}")
    count("bad inputs refused clearly")
    a_good_prompt_succeeds(server)


def test_model_folder_deleted_after_a_run_then_queued_again(server):
    """The folder goes after a run; the same workflow is queued again. ComfyUI keeps the output of an
    unchanged Loader, so either the Loader's queue-time check or the Sampler must notice."""
    count("bad inputs tried")
    folder = server.models_dir / "diffusers" / "deleted-flux"
    shutil.copytree(server.models_dir / "diffusers" / "tiny-flux1-dev", folder, symlinks=False)
    run_ok(server, sampler_prompt("deleted-flux"))
    run_ok(server, sampler_prompt("tiny-sd3"))  # the copy is no longer the loaded pipeline
    shutil.rmtree(folder)
    message = clear_error(server, sampler_prompt("deleted-flux"), (LOADER, SAMPLER), "deleted-flux")
    print(f"\n[bad input] model folder deleted after a run: {message.strip()[:200]}")
    count("bad inputs refused clearly")
    a_good_prompt_succeeds(server)


def test_compile_cache_folder_not_writable(server):
    """While ComfyUI runs (it has compiled before), the inductor cache folder is replaced by a file (as
    root, chmod would not stop a write). A shape never compiled here must then either compile without
    persisting and say so, or fail clearly naming the cache."""
    count("bad inputs tried")
    run_ok(server, with_compile(sampler_prompt(FLUX, mode="compiled"), server))  # 64x64 compiled (or reused)
    cache = inductor_cache(server)
    saved = cache.with_name(cache.name + ".saved")
    cache.rename(saved)
    try:
        cache.write_text("not a folder")
        prompt = with_compile(sampler_prompt(FLUX, width=128, height=64, mode="compiled"), server)
        how, node, message, entry = outcome(server, prompt, timeout=600)
    finally:
        cache.unlink()
        saved.rename(cache)
    if how == "ran":  # compiled without persisting: the run must say so
        node, message = SAMPLER, " ".join(run_info(entry)["notes"])
    print(f"\n[bad input] compile cache not writable: {how} on node {node}: {message.strip()[:200]}")
    assert node in (COMPILE, SAMPLER) and "cache" in message.lower(), message
    count("bad inputs refused clearly")
    a_good_prompt_succeeds(server)


def test_corrupt_file_in_the_compile_cache(server, tiny_dir, tmp_path):
    """A restarted ComfyUI finds a cached graph whose code file was cut short (as by a crash mid-write):
    the run must recompile and succeed, or fail clearly naming the cache."""
    count("bad inputs tried")
    run_ok(server, with_compile(sampler_prompt(FLUX, mode="compiled"), server))  # 64x64 is in the cache
    cache = tmp_path / "inductor"
    shutil.copytree(inductor_cache(server), cache, ignore=shutil.ignore_patterns("*.lock"))
    code_files = list(cache.rglob("*.py"))
    assert code_files, "the compiled graph left no code file in the cache"
    for path in code_files:
        path.write_bytes(path.read_bytes()[:len(path.read_bytes()) // 2])
    restarted = start_server(tmp_path / "base", tiny_dir, env={"TORCHINDUCTOR_CACHE_DIR": str(cache)})
    try:
        prompt = with_compile(sampler_prompt(FLUX, mode="compiled"), restarted)
        how, node, message, entry = outcome(restarted, prompt, timeout=600)
        print(f"\n[bad input] corrupt compile cache: {how} on node {node}: {message.strip()[:200]}")
        if how == "ran":  # recompiled, not run from the damaged file
            assert run_info(entry)["compiled_now"] is True and image_sizes(restarted, entry) == [(64, 64)]
        else:
            assert node in (COMPILE, SAMPLER) and "cache" in message.lower(), message
        count("bad inputs refused clearly")
        a_good_prompt_succeeds(restarted)
    finally:
        restarted.stop()


def test_two_clients_queueing_at_once_each_get_their_own_outcome(server):
    """Two clients each queue a bad and a good prompt at the same moment: all four are answered, each
    with its own error or images."""
    count("bad inputs tried")
    start = threading.Barrier(4)
    bad = meshed(workers="attach", address="127.0.0.1:9")(server)

    def bad_prompt(client):
        start.wait()
        return clear_error(server, bad, (MESH, SAMPLER), "127.0.0.1:9", client_id=client)

    def good_prompt(client, width):
        start.wait()
        return image_sizes(server, run_ok(server, sampler_prompt(FLUX, width=width), client_id=client))

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(bad_prompt, "client-a"), pool.submit(good_prompt, "client-a", 64),
                   pool.submit(bad_prompt, "client-b"), pool.submit(good_prompt, "client-b", 96)]
        results = [future.result(timeout=600) for future in futures]
    assert results[1] == [(64, 64)] and results[3] == [(96, 64)]
    count("bad inputs refused clearly")
    a_good_prompt_succeeds(server)


@pytest.mark.parametrize("field, sent, converted", [("prompt", None, "None"), ("seed", 1.5, 1)],
                         ids=["null-prompt", "float-seed"])
def test_a_value_comfyui_converts_is_refused_or_runs_exactly_as_converted(server, field, sent, converted):
    """ComfyUI 0.3.75 converts widget values before any node sees them (str(None) == "None",
    int(1.5) == 1: execution.py validate_inputs), so the pack cannot tell a null prompt from the
    text "None". Either it is refused clearly, or it runs exactly as the converted value: queued next,
    the converted value finds the Sampler's result in ComfyUI's cache (the same inputs)."""
    inputs = {"prompt": "a red cube", "seed": 7}
    how, node, message, as_sent = outcome(server, sampler_prompt(FLUX, **{**inputs, field: sent}))
    if how == "ran":
        assert image_sizes(server, as_sent) == [(64, 64)]
        as_converted = run_ok(server, sampler_prompt(FLUX, **{**inputs, field: converted}))
        cached = [node for kind, data in as_converted["status"]["messages"] if kind == "execution_cached"
                  for node in data["nodes"]]
        assert SAMPLER in cached, f"{field}={sent!r} ran as something other than {field}={converted!r}"
        count("inputs ComfyUI converts before the pack sees them (run as converted)")
    else:
        assert node == SAMPLER and field in message, message
