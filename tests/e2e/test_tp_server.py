"""A TP Mesh workflow through a real server of its own, which is then stopped: no worker may outlive it."""

import copy
import shutil

import numpy as np
from PIL import Image

from comfy_host import ComfyServer, execution_error, prepare_comfyui
from processes import alive_after, launched_workers, pid_alive


def with_mesh(prompt, chips=2):
    """Insert a TP Mesh (node 6) between Mode Selector (2) and Sampler (3)."""
    prompt["6"] = {"class_type": "TPUMesh", "inputs": {
        "pipeline": ["2", 0], "chips": chips, "replicas": 0, "shard_transformer": True, "shard_text_encoder": True,
        "workers": "launch_local", "address": "", "key": ""}}
    prompt["3"]["inputs"]["pipeline"] = ["6", 0]
    return prompt


def pixels(paths) -> list[np.ndarray]:
    """Saved frames as int arrays, in the order ComfyUI wrote them."""
    arrays = []
    for path in paths:
        with Image.open(path) as image:
            arrays.append(np.asarray(image.convert("RGB"), dtype=np.int16))
    return arrays


def test_tp_workflow_errors_on_the_node_runs_stays_warm_and_no_worker_outlives_the_server(tiny_dir, tmp_path,
                                                                                          workflow):
    base = tmp_path / "base"
    model = base / "models" / "diffusers" / "tiny-flux2"
    shutil.copytree(tiny_dir / "tiny-flux2", model)
    scheduler_config = model / "scheduler" / "scheduler_config.json"
    good_config = scheduler_config.read_text()
    scheduler_config.write_text("{ not json")  # passes the Loader's checks; only loading it fails, in the workers
    server = ComfyServer(prepare_comfyui(), base_dir=base).start()
    try:
        prompt = with_mesh(workflow())
        prompt["1"]["inputs"]["model"] = "tiny-flux2"
        prompt["3"]["inputs"].update(width=96, height=64, steps=2, guidance=4.0, seed=1)
        error = execution_error(server.run(prompt, timeout=600))
        assert error["node_id"] == "3" and error["exception_type"].endswith("ModelLoadError"), error
        assert "could not load component 'scheduler'" in error["exception_message"]
        [launcher] = launched_workers(server.process.pid)  # the workers answered the error and stayed up

        scheduler_config.write_text(good_config)
        entry = server.run(prompt, timeout=600)
        assert execution_error(entry) is None, execution_error(entry)
        info = entry["outputs"]["3"]["tpu_run_info"][0]
        assert info["world_size"] == 2 and info["loaded"] is True and info["worker_pids"][0] == launcher
        assert info["sharded_fraction_per_rank"] == [0.5, 0.5]
        assert info["grad_mode"] == "inference mode off, grad off"  # what TorchTPU's compile needs, in the workers too
        [png] = server.output_images(entry)
        with Image.open(png) as image:
            assert image.size == (96, 64)

        prompt["3"]["inputs"]["seed"] = 2
        again = server.run(prompt, timeout=600)
        assert again["outputs"]["3"]["tpu_run_info"][0]["loaded"] is False
        worker_pids = info["worker_pids"]
        assert len(worker_pids) == 3 and all(map(pid_alive, worker_pids))  # launcher + 2 ranks, warm

        # Wan 2.2 video over 2 context-parallel ranks: the same warm group, its frames through Save Image
        shutil.copytree(tiny_dir / "tiny-wan22-t2v-a14b", base / "models" / "diffusers" / "tiny-wan22-t2v-a14b")
        video = with_mesh(workflow())
        video["6"]["inputs"].update(replicas=0, context_parallel=2)
        video["1"]["inputs"]["model"] = "tiny-wan22-t2v-a14b"
        video["3"] = {"class_type": "TPUVideoSampler", "inputs": {
            "pipeline": ["6", 0], "prompt": "a cat walking", "negative_prompt": "", "width": 64, "height": 64,
            "frames": 5, "steps": 2, "guidance": 2.0, "seed": 3, "batch_size": 1}}
        entry = server.run(video, timeout=600)
        assert execution_error(entry) is None, execution_error(entry)
        info = entry["outputs"]["3"]["tpu_run_info"][0]
        assert (info["context_parallel"], info["tokens_per_rank"], info["frames"]) == (2, [16, 16], 5)
        assert info["worker_pids"] == worker_pids  # reshaped, not relaunched
        split_frames = pixels(server.output_images(entry))
        assert len(split_frames) == 5

        # the same video in ComfyUI's process, without the mesh: the same frames
        whole = copy.deepcopy(video)
        del whole["6"]
        whole["3"]["inputs"]["pipeline"] = ["2", 0]
        entry = server.run(whole, timeout=600)
        assert execution_error(entry) is None, execution_error(entry)
        in_process = entry["outputs"]["3"]["tpu_run_info"][0]
        assert (in_process["world_size"], in_process["context_parallel"]) == (1, 1)
        one_process = pixels(server.output_images(entry))
        assert max(int(np.abs(a - b).max()) for a, b in zip(split_frames, one_process, strict=True)) <= 1
    finally:
        server.stop()
    assert alive_after(worker_pids) == [], "a worker outlived the ComfyUI server"
