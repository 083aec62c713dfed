"""Worker processes through the real server: single-chip runs in a worker (TPU_DIFFUSERS_WORKER_PROCESS=always,
what `tpu` does on a TPU) give the images of ComfyUI's own process; a killed worker fails one run and the
next relaunches; a SIGKILLed ComfyUI leaves no worker, in the launch phase and while sampling; peers that
probe, stay silent or send garbage to a `--stay` group's control port do not stop a running prompt; workers
of another protocol version are refused by name; a soak alternating in-process and worker runs keeps
ComfyUI's memory flat.

Counted in the report: "faults survived", "worker prompts compared", "soak alternating ...".
"""

from __future__ import annotations

import os
import signal
import socket
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from harness import REPORT, WORKERS_KEY, count, start_server
from processes import (alive_after, children, launched_workers, other_version_checkout, start_staying_workers,
                       stop_workers)
from serving import (MESH, SAMPLER, clear_error, failure, run_info, run_ok, sampler_prompt, with_mesh)
from tpu_diffusers_runtime.distributed import channel, protocol
from tpu_diffusers_runtime.distributed.group import WORKER_SCRIPT

PACK = Path(__file__).resolve().parents[2]
ALWAYS = {"TPU_DIFFUSERS_WORKER_PROCESS": "always"}
LONG_STEPS = 400  # still sampling when the fault comes
SOAK_PROMPTS = 100
SOAK_RSS_AFTER = (10, 100)


@pytest.fixture(scope="module")
def worker_server(tiny_dir, tmp_path_factory):
    server = start_server(tmp_path_factory.mktemp("always"), tiny_dir, env=ALWAYS)
    try:
        yield server
    finally:
        server.stop()


def pixels(server, entry) -> list[np.ndarray]:
    arrays = []
    for path in server.output_images(entry):
        with Image.open(path) as image:
            arrays.append(np.asarray(image))
    return arrays


@pytest.mark.parametrize("model, batch", [("tiny-flux1-schnell", 2), ("tiny-sd3", 1), ("tiny-qwenimage", 1),
                                          ("tiny-flux2", 1)])
def test_single_chip_runs_in_a_worker_give_the_images_of_comfyuis_own_process(server, worker_server, model, batch):
    prompt = sampler_prompt(model, steps=2, seed=1234, batch_size=batch)
    here, there = run_ok(server, prompt), run_ok(worker_server, prompt)
    assert run_info(here)["world_size"] == 1 and not run_info(here)["worker_pids"]
    info = run_info(there)
    assert info["world_size"] == 1 and len(info["worker_pids"]) == 2, info  # launcher, rank 0
    assert info["task"] == run_info(here)["task"] and info["pipeline"] == run_info(here)["pipeline"]
    for ours, theirs in zip(pixels(server, here), pixels(worker_server, there), strict=True):
        assert np.array_equal(ours, theirs), f"{model}: the worker's image differs from ComfyUI's own"
    again = run_info(run_ok(worker_server, sampler_prompt(model, steps=2, batch_size=batch)))
    assert again["loaded"] is False and again["worker_pids"] == info["worker_pids"]  # warm: nothing loaded
    count("worker prompts compared")


def test_a_killed_worker_fails_its_run_clearly_and_the_next_run_relaunches(worker_server):
    pids = run_info(run_ok(worker_server, sampler_prompt()))["worker_pids"]
    with worker_server.events() as events:
        prompt_id = worker_server.queue(sampler_prompt(steps=LONG_STEPS), client_id=events.client_id)
        events.wait_for(lambda m: m["type"] == "progress" and m["data"].get("prompt_id") == prompt_id
                        and m["data"]["max"] == LONG_STEPS and m["data"]["value"] >= 2, timeout=300)
        os.kill(pids[1], signal.SIGKILL)
        node, message = failure(worker_server.wait(prompt_id, timeout=120))
    assert node == SAMPLER and "worker rank 0 failed" in message and "SIGKILL" in message, message
    assert alive_after(pids, timeout=30) == []
    info = run_info(run_ok(worker_server, sampler_prompt()))
    assert info["loaded"] is True and not set(info["worker_pids"]) & set(pids)
    count("faults survived")


@pytest.mark.parametrize("phase", ["launching a 2-rank TP group", "sampling in a single-chip worker"])
def test_a_sigkilled_comfyui_leaves_no_worker_in_any_phase(tiny_dir, tmp_path, phase):
    server = start_server(tmp_path / "base", tiny_dir, env=ALWAYS)
    started: list[int] = []
    try:
        with server.events() as events:
            if phase.startswith("launching"):
                prompt = with_mesh(sampler_prompt(steps=2))

                def ready(m, prompt_id):  # torchrun has started both ranks; rank 0 has no client yet
                    if not (m["type"] == "progress" and m["data"].get("prompt_id") == prompt_id):
                        return False
                    launchers = launched_workers(server.process.pid)
                    ranks = [rank for launcher in launchers for rank in children(launcher)]
                    started[:] = launchers + ranks
                    return len(ranks) >= 2
            else:
                prompt = sampler_prompt(steps=LONG_STEPS)

                def ready(m, prompt_id):
                    if not (m["type"] == "progress" and m["data"].get("prompt_id") == prompt_id
                            and m["data"]["max"] == LONG_STEPS and m["data"]["value"] >= 2):
                        return False
                    launchers = launched_workers(server.process.pid)
                    started[:] = launchers + [rank for launcher in launchers for rank in children(launcher)]
                    return True
            prompt_id = server.queue(prompt, client_id=events.client_id)
            events.wait_for(lambda m: ready(m, prompt_id), timeout=300)  # the Sampler reports progress meanwhile
            server.kill()
    finally:
        server.stop()
    left = alive_after(started, timeout=10)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    print(f"\n[fault] ComfyUI SIGKILLed while {phase}: workers {started}, alive 10 s later {left}")
    assert started and left == [], f"workers outlived the killed ComfyUI by 10 s: {left}"
    count("faults survived")


def test_probes_silent_and_garbage_clients_on_the_control_port_do_not_stop_a_running_prompt(server, tmp_path):
    process, address, _ = start_staying_workers(WORKER_SCRIPT, tmp_path / "workers.log", ranks=2, key=WORKERS_KEY)
    try:
        prompt = with_mesh(sampler_prompt(steps=40), workers="attach", address=address)
        host, port = channel.parse_address(address)
        with server.events() as events:
            prompt_id = server.queue(prompt, client_id=events.client_id)
            events.wait_for(lambda m: m["type"] == "progress" and m["data"].get("prompt_id") == prompt_id
                            and m["data"]["max"] == 40, timeout=300)
            socket.create_connection((host, port)).close()  # nc -z, a health check
            silent = socket.create_connection((host, port))
            garbage = socket.create_connection((host, port))
            garbage.sendall(os.urandom(65536))
            entry = server.wait(prompt_id, timeout=300)
        assert entry["status"]["status_str"] == "success", entry["status"]
        assert run_info(entry)["world_size"] == 2
        server.post("/free", {"unload_models": True, "free_memory": True})  # detach: the peers get their turn
        silent_kept = time.monotonic()
        again = run_info(run_ok(server, with_mesh(sampler_prompt(), workers="attach", address=address)))
        assert again["world_size"] == 2 and process.poll() is None
        print(f"\n[fault] probe + silent + garbage clients on a --stay group: prompt ok, next attach after "
              f"{time.monotonic() - silent_kept:.1f}s")
        silent.close()
        garbage.close()
        count("faults survived")
    finally:
        stop_workers(process)


def test_workers_of_another_protocol_version_are_refused_on_the_node(server, tmp_path):
    worker_script = other_version_checkout(PACK, tmp_path / "other_checkout", "9.0.0")
    process, address, _ = start_staying_workers(worker_script, tmp_path / "workers.log", key=WORKERS_KEY)
    try:
        prompt = with_mesh(sampler_prompt(), workers="attach", address=address)
        message = clear_error(server, prompt, (SAMPLER, MESH), "protocol mismatch",
                              f"protocol {protocol.PROTOCOL_VERSION + 1}", f"protocol {protocol.PROTOCOL_VERSION}",
                              "same version")
        print(f"\n[fault] workers of protocol {protocol.PROTOCOL_VERSION + 1}: {message.strip()[:300]}")
        assert process.poll() is None
        count("faults survived")
    finally:
        stop_workers(process)


def test_soak_alternating_in_process_and_worker_runs_keeps_comfyuis_memory_flat(server):
    """Even prompts in ComfyUI's process, odd ones in a one-rank worker group (a TP Mesh of one chip)."""
    rss = {}
    for i in range(SOAK_PROMPTS):
        prompt = sampler_prompt(seed=i)
        if i % 2:
            prompt = with_mesh(prompt, chips=1)
        entry = run_ok(server, prompt, timeout=300)
        assert len(server.output_images(entry)) == 1
        assert (run_info(entry)["worker_pids"] != []) == bool(i % 2)
        if i + 1 in SOAK_RSS_AFTER:
            rss[i + 1] = server.rss_bytes()
    first, last = (rss[n] for n in SOAK_RSS_AFTER)
    growth = (last - first) / first
    REPORT["soak alternating in-process / worker, RSS after prompt 10 / 100"] = \
        f"{first / 2**20:.0f} MiB / {last / 2**20:.0f} MiB ({growth:+.1%})"
    assert growth < 0.05, f"ComfyUI's RSS grew {growth:+.1%} between prompt 10 and 100"
