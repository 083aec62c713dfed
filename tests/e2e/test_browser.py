"""The shared workflows and the pack's page extension in the real ComfyUI page (frontend 1.32.9),
driven in Debian's Chromium: workflows load with every node known, convert to prompts the server
takes, the offline demo runs from the page, and our nodes show what ran.

Screenshots go to tests/e2e/artifacts/ on every run; with UPDATE_SCREENSHOT=1 they also replace
the committed ones (docs/screenshot.png and the workflows' .jpg thumbnails).
"""

import io
import json
import os
import re
import time
import urllib.request
import zlib
from pathlib import Path

import pytest
from PIL import Image, ImageDraw
from playwright.sync_api import expect, sync_playwright

from comfy_host import PACK_NAME, ROOT, PromptRejected, execution_error

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]
# The page as a user with a finished first run sees it, minus overlays that hide the graph.
PAGE_SETTINGS = {"Comfy.Minimap.Visible": False, "Comfy.Graph.CanvasInfo": False, "Comfy.Graph.CanvasMenu": False,
                 "Comfy.Workflow.WorkflowTabsPosition": "Sidebar"}
VIEWPORT = {"width": 1400, "height": 800}
THUMBNAIL_VIEWPORT, THUMBNAIL_SIZE = {"width": 1200, "height": 900}, (400, 300)

WORKFLOWS = sorted((ROOT / "workflows").glob("*.json"))
DEMO = ROOT / "workflows" / "tpu_demo_tiny_flux.json"
ARTIFACTS = Path(__file__).parent / "artifacts"
UPDATE = os.environ.get("UPDATE_SCREENSHOT") == "1"

pytestmark = pytest.mark.skipif(not Path(CHROMIUM).exists(),
                                reason=f"no {CHROMIUM}: apt-get install -y chromium")


@pytest.fixture(scope="module")
def page(server):
    """One page of the session's server for the whole module; loading ComfyUI takes seconds."""
    for setting, value in PAGE_SETTINGS.items():
        server.post(f"/settings/{setting}", value)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_FLAGS)
        context = browser.new_context(viewport=VIEWPORT)
        context.add_init_script("localStorage.setItem('vueNodesBannerDismissed', 'true')")  # the "Nodes 2.0" banner
        page = context.new_page()
        page.script_errors = []
        page.on("pageerror", lambda error: page.script_errors.append(f"{error}\n{error.stack}"))
        page.on("console", lambda message: page.script_errors.append(message.text)
                if message.type == "error" and "tpu_diffusers" in f"{message.text}{message.location}" else None)
        page.goto(server.url)
        page.wait_for_function("window.app?.graph && 'TPUSampler' in LiteGraph.registered_node_types", timeout=120_000)
        yield page
        browser.close()


def load(page, path: Path) -> dict:
    """Open a UI workflow as a user would, after closing any dialog an earlier load left open."""
    dialogs = page.locator("[role=dialog]")
    if dialogs.count():
        page.keyboard.press("Escape")
        expect(dialogs).to_have_count(0)
    workflow = json.loads(path.read_text())
    # Each load opens a new workflow tab: close the open ones first, so the page (and its
    # screenshots) shows one, named after the file.
    page.evaluate("""async ([workflow, name]) => {
        const store = app.extensionManager.workflow;
        for (const open of [...store.openWorkflows]) await store.closeWorkflow(open);
        await app.loadGraphData(workflow, true, true, name);
    }""", [workflow, path.stem])
    return workflow


def node_of(workflow: dict, *node_types: str) -> dict:
    [node] = [n for n in workflow["nodes"] if n["type"] in node_types]
    return node


def placeholder_picture(name: str, transparent_middle: bool) -> Image.Image:
    """A stand-in for a user's picture, the same for a name on every run: a two-colour gradient with a
    disc; with a transparent middle where an inpaint mask is read from it (Load Image's MASK = 1 - alpha)."""
    crc = zlib.crc32(name.encode())
    top, bottom = [((crc >> shift) % 156 + 60, (crc >> shift + 3) % 156 + 60, (crc >> shift + 6) % 156 + 60)
                   for shift in (0, 11)]
    width, height = 512, 384
    picture = Image.new("RGBA", (width, height))
    for row in range(height):
        mix = row / (height - 1)
        picture.paste(tuple(round(a + (b - a) * mix) for a, b in zip(top, bottom)) + (255,), (0, row, width, row + 1))
    ImageDraw.Draw(picture).ellipse((150, 90, 362, 302), fill=bottom[::-1] + (255,))
    if transparent_middle:
        picture.paste((0, 0, 0, 0), (176, 128, 336, 256))
    return picture


@pytest.fixture(scope="module")
def input_images(server):
    """The pictures the workflows' Load Image nodes name, in the server's input folder, where a user puts
    or uploads them: so a workflow's graph passes the queue-time checks of every node but the loader's
    (the models are absent), and its thumbnail shows the Load Image previews."""
    folder = server.base_dir / "input"
    folder.mkdir(exist_ok=True)
    for path in WORKFLOWS:
        workflow = json.loads(path.read_text())
        for node in workflow["nodes"]:
            if node["type"] == "LoadImage":
                name, masked = node["widgets_values"][0], bool(node["outputs"][1]["links"])  # MASK used
                placeholder_picture(name, masked).save(folder / name)
    return folder


def redrawn(page) -> None:
    """Two animation frames: the canvas has drawn what was just set."""
    page.evaluate("() => new Promise(done => requestAnimationFrame(() => requestAnimationFrame(done)))")


def fit_view(page) -> None:
    """The graph fitted to the window at once (the UI's Fit View command animates for 350 ms)."""
    page.evaluate("app.canvas.fitViewToSelectionAnimated({duration: 1, zoom: 0.9})")
    redrawn(page)


def page_statuses(page) -> dict:
    return {str(k): v for k, v in page.evaluate(
        "() => Object.fromEntries(app.graph.nodes.map(n => [n.id, n.tpuStatus ?? null]))").items()}


def assert_status_shows(status: str, info: dict) -> None:
    """A node's status says what the Sampler's run info says."""
    ran = info["mode"].split(" (")[0]  # "compiled (backend inductor)" shows as "compiled"
    assert status and status.startswith(f"{info['device']} · {ran} · "), status
    if info["loaded"]:
        assert abs(shown_seconds(status, "loaded") - info["load_seconds"]) <= 0.05, (status, info)
    else:
        assert "· already loaded ·" in status, status
    assert abs(shown_seconds(status, "sampled") - info["sample_seconds"]) <= 0.05, (status, info)


def test_the_extension_is_served_and_registered(page, server):
    assert f"/extensions/{PACK_NAME}/tpu_diffusers.js" in server.get("/extensions")
    assert page.evaluate("app.extensions.some(e => e.name === 'tpu_diffusers.status')")


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.stem)
def test_workflow_loads_with_every_node_known_and_its_widget_values(page, path):
    workflow = json.loads(path.read_text())
    assert workflow["extra"]["tpu_diffusers"]["hardware"].strip()
    types = sorted({node["type"] for node in workflow["nodes"]})
    unknown = page.evaluate("types => types.filter(t => !(t in LiteGraph.registered_node_types))", types)
    assert not unknown, f"node types the page does not know: {unknown}"

    load(page, path)
    dialogs = page.locator("[role=dialog]")
    assert dialogs.count() == 0, dialogs.first.inner_text()
    loaded = page.evaluate("() => app.graph.nodes.map(n => ({id: n.id, type: n.type, broken: !!n.has_errors, "
                           "values: (n.widgets ?? []).map(w => w.value)}))")
    assert {n["id"]: (n["type"], n["widgets_values"], False) for n in workflow["nodes"]} == \
        {n["id"]: (n["type"], n["values"], n["broken"]) for n in loaded}


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.stem)
def test_workflow_converts_to_a_prompt_that_runs_or_is_refused_on_the_loader(page, server, input_images, path):
    """The page's own graphToPrompt, then POST /prompt. Models other than the offline demo's are
    absent here: the loader refuses them when the prompt is queued, naming the missing folder or file.
    Every link arrives as the input it names (Load Image's IMAGE and MASK at the Sampler's image inputs),
    and the Sampler's checks pass (width 0 with an image, a mask with its image)."""
    workflow = load(page, path)
    prompt = page.evaluate("async () => (await app.graphToPrompt()).output")
    assert {str(n["id"]): n["type"] for n in workflow["nodes"]} == {k: v["class_type"] for k, v in prompt.items()}
    nodes = {n["id"]: n for n in workflow["nodes"]}
    for _, origin, slot, target, target_slot, _ in workflow["links"]:
        name = nodes[target]["inputs"][target_slot]["name"]
        assert prompt[str(target)]["inputs"][name] == [str(origin), slot], (name, prompt[str(target)])
    if path == DEMO:
        entry = server.run(prompt, timeout=300)
        error = execution_error(entry)
        assert error is None, error["exception_message"]
        assert server.output_images(entry)
        return
    [loader] = [n for n in workflow["nodes"] if n["type"] in ("TPULoader", "TPUFileLoader")]
    model = loader["widgets_values"][0]
    with pytest.raises(PromptRejected) as rejected:
        server.queue(prompt)
    errors = rejected.value.body["node_errors"]
    files = {str(n["id"]): n["widgets_values"][0] for n in workflow["nodes"]
             if n["type"] in ("TPULora", "TPULatentUpscaleModel")}
    assert sorted(errors) == sorted([str(loader["id"]), *files]), errors
    for node_id, name in files.items():  # LoRA and latent upscaler files are absent here too
        assert f"'{name}' was not found" in errors[node_id]["errors"][0]["details"], errors[node_id]
    missing = f"model: model folder '{model}' was not found" if loader["type"] == "TPULoader" \
        else f"'{model}' was not found"
    for error in errors[str(loader["id"])]["errors"]:
        assert missing in error["details"], error


def history_entry_with_seed(server, sampler_id: str, seed: int, timeout: float = 300) -> dict:
    """The finished /history entry of the prompt whose Sampler used `seed` (queued by the page)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for entry in server.get("/history").values():
            inputs = entry["prompt"][2].get(sampler_id, {}).get("inputs", {})
            if inputs.get("seed") == seed and entry.get("status", {}).get("completed") is not None:
                return entry
        time.sleep(0.5)
    raise TimeoutError(f"no finished prompt with seed {seed} within {timeout}s")


def shown_seconds(status: str, label: str) -> float:
    """The time after `label` in a status ("loaded 1.5s"), as shown: rounded to 0.1 s."""
    return float(re.search(rf"{label} (\d+\.\d)s", status).group(1))


def test_demo_runs_from_the_page_shows_its_image_and_what_ran_on_our_nodes(page, server):
    workflow = load(page, DEMO)
    sampler, save = str(node_of(workflow, "TPUSampler")["id"]), str(node_of(workflow, "SaveImage")["id"])
    seed = int(time.time()) % 1_000_000  # never queued before, so ComfyUI's cache cannot skip the Sampler
    page.evaluate("([id, seed]) => { app.graph.getNodeById(id).widgets.find(w => w.name === 'seed').value = seed }",
                  [sampler, seed])
    page.evaluate("app.queuePrompt(0)")
    entry = history_entry_with_seed(server, sampler, seed)
    error = execution_error(entry)
    assert error is None, error["exception_message"]

    [saved] = entry["outputs"][save]["images"]
    page.wait_for_function("id => app.graph.getNodeById(id).imgs?.[0]?.naturalWidth > 0", arg=save, timeout=30_000)
    [(src, width, height)] = page.evaluate(
        "id => app.graph.getNodeById(id).imgs.map(i => [i.src, i.naturalWidth, i.naturalHeight])", save)
    assert "/view?" in src and f"filename={saved['filename']}&" in src, src
    asked = entry["prompt"][2][sampler]["inputs"]
    assert (width, height) == (asked["width"], asked["height"])

    info = entry["outputs"][sampler]["tpu_run_info"][0]
    statuses = page_statuses(page)
    for node in workflow["nodes"]:
        status = statuses[str(node["id"])]
        if node["type"].startswith("TPU"):
            assert_status_shows(status, info)
        else:
            assert status is None, node["type"]

    fit_view(page)
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=ARTIFACTS / "demo_page.png")
    if UPDATE:
        (ROOT / "docs").mkdir(exist_ok=True)
        page.screenshot(path=ROOT / "docs" / "screenshot.png")


def test_a_workflow_saved_before_the_image_inputs_loads_with_denoise_1_and_runs(page, server, tmp_path):
    """A Sampler saved before denoise, the image inputs and prompt_upsampling existed (widgets_values end at
    batch_size, its inputs name only the pipeline) loads with every saved value, denoise 1.0, prompt_upsampling on
    and the image sockets, and its prompt runs."""
    workflow = json.loads(DEMO.read_text())
    sampler = node_of(workflow, "TPUSampler")
    *saved, denoise, upsampling = sampler["widgets_values"]
    # the shipped demo is saved with them; the file a user saved before is without them
    assert (denoise, upsampling) == (1.0, True)
    saved[6] = 2_000_000 + int(time.time()) % 1_000_000  # the seed: above those the other tests queue
    sampler["widgets_values"], sampler["inputs"] = saved, [i for i in sampler["inputs"] if i["name"] == "pipeline"]
    old = tmp_path / "saved_before_denoise.json"
    old.write_text(json.dumps(workflow))
    load(page, old)
    loaded = page.evaluate("id => { const n = app.graph.getNodeById(id); return {names: n.widgets.map(w => w.name), "
                           "values: n.widgets.map(w => w.value), sockets: n.inputs.filter(i => !i.widget)"
                           ".map(i => i.name)} }", sampler["id"])
    assert loaded["names"][-2:] == ["denoise", "prompt_upsampling"] and loaded["values"] == [*saved, 1.0, True]
    assert loaded["sockets"] == ["pipeline", "image", "image_2", "image_3", "mask", "latent"]
    prompt = page.evaluate("async () => (await app.graphToPrompt()).output")
    assert prompt[str(sampler["id"])]["inputs"]["denoise"] == 1.0
    assert prompt[str(sampler["id"])]["inputs"]["prompt_upsampling"] is True
    entry = server.run(prompt, timeout=300)
    error = execution_error(entry)
    assert error is None, error["exception_message"]
    assert server.output_images(entry)


def test_status_shows_on_our_nodes_inside_a_subgraph_after_a_run(page, server):
    """ComfyUI runs a subgraph's nodes under their path ("5:3") and the page hands the Sampler's
    output to the node at that path: the status reaches our nodes inside the subgraph."""
    load(page, DEMO)
    seed = int(time.time()) % 1_000_000 + 1  # not the seed of the demo test just before
    sampler_path, inner_ids = page.evaluate("""seed => {
        const sampler = app.graph.nodes.find(n => n.type === 'TPUSampler');
        sampler.widgets.find(w => w.name === 'seed').value = seed;
        const ours = app.graph.nodes.filter(n => n.type.startsWith('TPU'));
        const { node } = app.graph.convertToSubgraph(new Set(ours));
        return [`${node.id}:${sampler.id}`, ours.map(n => n.id)];
    }""", seed)
    page.evaluate("app.queuePrompt(0)")
    entry = history_entry_with_seed(server, sampler_path, seed)
    error = execution_error(entry)
    assert error is None, error["exception_message"]

    info = entry["outputs"][sampler_path]["tpu_run_info"][0]
    page.wait_for_function("() => app.graph.nodes.find(n => n.isSubgraphNode?.()).subgraph.nodes"
                           ".every(n => n.tpuStatus)", timeout=30_000)
    inner = page.evaluate("() => app.graph.nodes.find(n => n.isSubgraphNode?.()).subgraph.nodes"
                          ".map(n => [n.id, n.tpuStatus])")
    assert sorted(node_id for node_id, _ in inner) == sorted(inner_ids)
    for _, status in inner:
        assert_status_shows(status, info)


COMPILED = dict(device="tpu", mode="compiled (backend tpu)", placement="model_cpu_offload", loaded=True,
                load_seconds=41.26, sample_seconds=9.81, peak_device_memory_mb=30720.0, compiled_now=True,
                compile_seconds=123.44, notes=[],
                compile_cache=dict(inductor="/home/me/ComfyUI/user/tpu_diffusers/compile_cache/inductor",
                                   tpu_tier3="gs://fleet-cache/tpu"),
                compile_cache_lookups=dict(fxgraph_hits=0, fxgraph_misses=2, tpu_hits=0, tpu_misses=3))
STATUS_CASES = [
    (COMPILED, "tpu · compiled · offload · loaded 41.3s · sampled 9.8s · peak 30.0 GB\ncompiled now 123.4s\n"
               "cache gs://fleet-cache/tpu · 0 hit(s), 5 miss(es)"),
    ({**COMPILED, "loaded": False, "compiled_now": False, "compile_seconds": 0.0, "device": "cpu",
      "compile_cache_lookups": dict(fxgraph_hits=2, fxgraph_misses=0)},
     "cpu · compiled · offload · already loaded · sampled 9.8s · peak 30.0 GB\ncompile reused\n"
     "cache …/tpu_diffusers/compile_cache/inductor · 2 hit(s), 0 miss(es)"),
    ({**COMPILED, "device": "cpu", "placement": "device", "peak_device_memory_mb": None, "compiled_now": None,
      "mode": "eager (fused eager needs TorchTPU; cpu has no equivalent, ran strict eager)"},
     "cpu · eager · loaded 41.3s · sampled 9.8s\nfused eager needs TorchTPU; cpu has no equivalent, ran strict eager"),
]


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.stem)
def test_run_info_reaches_the_sampler_and_every_node_of_ours_up_its_pipeline_chain(page, path):
    """ComfyUI's `executed` message with the Sampler's ui output, as the server sends it, dispatched
    through the page's api object: the page's own handler gives it to the Sampler's onExecuted."""
    workflow = load(page, path)
    sampler = str(node_of(workflow, "TPUSampler", "TPUVideoSampler")["id"])
    chain = pipeline_chain(workflow, sampler)
    assert {n["type"] for n in workflow["nodes"] if str(n["id"]) in chain} >= {"TPULoader", "TPUFileLoader"} & \
        {n["type"] for n in workflow["nodes"]}  # the chain reaches the loader
    for info, expected in STATUS_CASES:
        detail = {"node": sampler, "display_node": sampler, "output": {"tpu_run_info": [info]}, "prompt_id": "test"}
        page.evaluate("detail => window.comfyAPI.api.api.dispatchEvent(new CustomEvent('executed', {detail}))",
                      detail)
        statuses = page_statuses(page)
        assert {str(n["id"]): expected if str(n["id"]) in chain else None for n in workflow["nodes"]} == statuses


def pipeline_chain(workflow: dict, sampler: str) -> set[str]:
    """The ids of the Sampler and of the nodes up its `pipeline` input links (Compile, Mesh, Mode, LoRA, Loader): the
    nodes the run info is about; other nodes of ours (TPU Latent Upscale Model) and ComfyUI's show none."""
    nodes = {str(n["id"]): n for n in workflow["nodes"]}
    origins = {link[0]: str(link[1]) for link in workflow["links"]}
    chain, node_id = set(), sampler
    while node_id is not None:
        chain.add(node_id)
        link = next((i["link"] for i in nodes[node_id]["inputs"] if i["name"] == "pipeline"), None)
        node_id = origins.get(link)
    return chain


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.stem)
def test_workflow_has_a_thumbnail_the_template_browser_serves(page, server, input_images, path):
    """Rendered from the page each run (artifacts/); the committed .jpg is what ComfyUI's
    template browser shows for this pack's workflows."""
    load(page, path)
    assert page.locator("[role=dialog]").count() == 0, "fix the workflow before rendering its thumbnail"
    page.wait_for_function("() => app.graph.nodes.filter(n => n.type === 'LoadImage')"
                           ".every(n => n.imgs?.[0]?.complete && n.imgs[0].naturalWidth > 0)", timeout=30_000)
    page.set_viewport_size(THUMBNAIL_VIEWPORT)
    page.evaluate("app.extensionManager.focusMode = true")
    try:
        redrawn(page)  # the canvas takes the new size first, or the view fits the old one
        fit_view(page)
        shot = Image.open(io.BytesIO(page.screenshot())).convert("RGB").resize(THUMBNAIL_SIZE, Image.LANCZOS)
    finally:
        page.evaluate("app.extensionManager.focusMode = false")
        page.set_viewport_size(VIEWPORT)
    (ARTIFACTS / "thumbnails").mkdir(parents=True, exist_ok=True)
    shot.save(ARTIFACTS / "thumbnails" / f"{path.stem}.jpg", quality=85)
    committed = path.with_suffix(".jpg")
    if UPDATE:
        shot.save(committed, quality=85)

    assert committed.exists(), f"no {committed.name}: run this test with UPDATE_SCREENSHOT=1"
    with Image.open(committed) as image:
        assert (image.format, image.size) == ("JPEG", THUMBNAIL_SIZE)
    assert path.stem in server.get("/workflow_templates")[PACK_NAME]
    served = page.request.get(f"{server.url}/api/workflow_templates/{PACK_NAME}/{committed.name}")
    assert served.ok and served.headers["content-type"] == "image/jpeg"
    assert served.body() == committed.read_bytes()


def test_help_page_of_each_node_of_ours_covers_its_inputs(server):
    """Where the frontend's node help looks for a custom node: /extensions/<pack>/docs/<node>.md."""
    ours = {name: node for name, node in server.get("/object_info").items() if node["category"] == "TPU Diffusers"}
    pages = {p.stem for p in (ROOT / "web" / "docs").glob("*.md")}
    assert pages == set(ours), "a help page per node, none for a node that does not exist"
    for name, node in ours.items():
        assert node["python_module"] == f"custom_nodes.{PACK_NAME}"
        with urllib.request.urlopen(f"{server.url}/extensions/{PACK_NAME}/docs/{name}.md") as response:
            text = response.read().decode()
        for input_name in [*node["input"]["required"], *node["input"].get("optional", {})]:
            assert f"**{input_name}**" in text, f"{name}.md does not explain {input_name}"


def test_no_script_errors_from_the_pack(page):
    """Runs last in this module: errors thrown while drawing or handling events end up here."""
    assert page.script_errors == []
