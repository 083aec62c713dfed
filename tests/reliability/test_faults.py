"""Faults through the real server: Cancel (/interrupt) in each phase before sampling, a TP worker
killed mid-run, ComfyUI itself killed with SIGKILL during a TP run. After each the server (or a new
one) serves again and nothing is left running.

The phase of a run is read from ComfyUI's websocket: the Sampler reports progress as (value, max),
with max = the pipeline's parts + 1 while loading, the number of warm-up sizes while warming up, 1
while TP workers start, and the step count while sampling (5 here, unlike all the others).

Counted in the report: "faults survived".
"""

from __future__ import annotations

import os
import signal
import time


from harness import count, start_server
from processes import alive_after, children, launched_workers, pid_alive
from serving import (SAMPLER, failure, interrupted_on, run_info, run_ok, sampler_prompt, with_compile,
                     with_mesh)

STEPS = 5  # sampling progress has max == STEPS; no other phase reports 5
LONG_STEPS = 400  # a TP run that is still sampling when the fault comes (~50 ms a step)


def progress_of(events, prompt_id: str) -> list[tuple[int, int]]:
    """(value, max) of every progress message of a prompt read so far."""
    return [(m["data"]["value"], m["data"]["max"]) for m in events.seen
            if m["type"] == "progress" and m["data"]["prompt_id"] == prompt_id]


def is_message(kind: str, prompt_id: str, **data):
    return lambda m: m["type"] == kind and m["data"].get("prompt_id") == prompt_id and \
        all(m["data"].get(k) == v for k, v in data.items())


def sampler_progress(message, prompt_id) -> bool:
    """The prompt's first progress message: the Sampler has begun its first phase."""
    return is_message("progress", prompt_id)(message)


def kill_leftovers(pids) -> None:
    """Leave none of these processes behind, whatever the test found (after its assertions)."""
    for pid in filter(pid_alive, pids):
        os.kill(pid, signal.SIGKILL)


def interrupt_when(server, prompt: dict, ready, timeout: float = 600) -> tuple[dict, list[tuple[int, int]]]:
    """Queue `prompt`, POST /interrupt at the first websocket message `ready(message, prompt_id)` accepts,
    and wait for the end. Returns the history entry and the Sampler's progress seen before the interrupt
    took effect. `timeout` bounds each wait (against hangs)."""
    with server.events() as events:
        prompt_id = server.queue(prompt, client_id=events.client_id)
        events.wait_for(lambda m: ready(m, prompt_id), timeout)
        server.post("/interrupt", {})
        events.wait_for(lambda m: m["type"] in ("execution_interrupted", "execution_error", "execution_success")
                        and m["data"].get("prompt_id") == prompt_id, timeout)
        return server.wait(prompt_id, timeout), progress_of(events, prompt_id)


def test_interrupt_during_loading_stops_it_and_the_next_run_loads_afresh(server):
    run_ok(server, sampler_prompt("tiny-sd3"))  # so tiny-flux1-dev is not the loaded pipeline
    prompt = sampler_prompt("tiny-flux1-dev", steps=STEPS)
    entry, progress = interrupt_when(server, prompt, sampler_progress)
    print(f"\n[fault] /interrupt while loading: progress before it took effect {progress}")
    assert interrupted_on(entry) == SAMPLER, entry["status"]
    assert progress and all(total != STEPS for _, total in progress), "it was not interrupted while loading"
    again = run_ok(server, sampler_prompt("tiny-flux1-dev", steps=STEPS))
    assert run_info(again)["loaded"] is True  # nothing half-loaded was kept
    count("faults survived")


def test_interrupt_during_warm_up_stops_it_and_the_next_run_warms_up_again(server):
    """Warm-up sizes 64x64 and 96x64, interrupted after the first warm-up step (a compile under way
    finishes first). The next run warms up again what was not finished, and samples."""
    run_ok(server, sampler_prompt("tiny-flux1-schnell"))  # loaded and eager: the next compiled run warms up
    prompt = with_compile(sampler_prompt("tiny-flux1-schnell", mode="compiled", steps=STEPS), server,
                          warmup_sizes="64x64, 96x64")
    entry, progress = interrupt_when(server, prompt, sampler_progress)
    print(f"\n[fault] /interrupt during warm-up: progress before it took effect {progress}")
    assert interrupted_on(entry) == SAMPLER, entry["status"]
    assert progress and all(total == 2 for _, total in progress), "it was not interrupted during warm-up"
    # The interrupt came during warm-up, so 96x64 (the second size) was not finished; 64x64 may have been.
    again = with_compile(sampler_prompt("tiny-flux1-schnell", mode="compiled", steps=STEPS), server,
                         warmup_sizes="64x64, 96x64")
    notes = run_info(run_ok(server, again))["notes"]
    assert any(note.startswith("warm-up") and "96x64" in note for note in notes), notes
    count("faults survived")


def tp_prompt(steps: int = 2) -> dict:
    return with_mesh(sampler_prompt("tiny-flux1-schnell", steps=steps))


def test_interrupt_while_tp_workers_start_leaves_none_running_and_the_next_run_launches(server):
    server.post("/free", {"unload_models": True, "free_memory": True})  # no warm group: the next run starts one
    deadline = time.monotonic() + 60  # a bound against hangs
    while launched_workers(server.process.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert launched_workers(server.process.pid) == [], "Unload Models left the worker group running"

    started = {}

    def ranks_started(message, prompt_id):
        """TP start is reported as progress (0, 1); wait until torchrun has started both ranks."""
        if not is_message("progress", prompt_id, max=1)(message):
            return False
        launchers = launched_workers(server.process.pid)
        ranks = [rank for launcher in launchers for rank in children(launcher)]
        started.update(launchers=launchers, ranks=ranks)
        return len(ranks) >= 2

    entry, progress = interrupt_when(server, tp_prompt(), ranks_started, timeout=300)
    half_started = started["launchers"] + started["ranks"]
    try:
        print(f"\n[fault] /interrupt while TP workers start: launcher {started['launchers']}, "
              f"ranks {started['ranks']}")
        assert interrupted_on(entry) == SAMPLER, entry["status"]
        info = run_info(run_ok(server, tp_prompt()))  # the next run launches a group of its own
        assert info["world_size"] == 2 and info["loaded"] is True
        left = alive_after(half_started, timeout=30)
        assert left == [], f"processes of the cancelled start still run: {left}"
        count("faults survived")
    finally:
        kill_leftovers(half_started)


def test_a_killed_tp_worker_fails_the_run_naming_its_rank_and_the_next_run_relaunches(server):
    pids = run_info(run_ok(server, tp_prompt()))["worker_pids"]  # launcher, rank 0, rank 1
    assert len(pids) == 3 and all(map(pid_alive, pids))
    with server.events() as events:
        prompt_id = server.queue(tp_prompt(steps=LONG_STEPS), client_id=events.client_id)
        events.wait_for(lambda m: is_message("progress", prompt_id, max=LONG_STEPS)(m) and m["data"]["value"] >= 2,
                        timeout=300)
        killed_at = time.monotonic()
        os.kill(pids[2], signal.SIGKILL)
        events.wait_for(lambda m: m["type"] in ("execution_error", "execution_success")
                        and m["data"].get("prompt_id") == prompt_id, timeout=60)
        seconds = time.monotonic() - killed_at
    try:
        node, message = failure(server.wait(prompt_id, timeout=60))
        print(f"\n[fault] TP rank 1 killed mid-run: failed after {seconds:.1f}s: {message.strip()[:300]}")
        assert node == SAMPLER and "rank 1" in message, message
        assert seconds <= 10, f"the run failed {seconds:.1f}s after the kill (the bound is 10 s)"
        assert alive_after(pids, timeout=30) == [], "the rest of the killed group is still running"
        info = run_info(run_ok(server, tp_prompt()))
        assert info["loaded"] is True and not set(info["worker_pids"]) & set(pids)  # a new group
        count("faults survived")
    finally:
        kill_leftovers(pids)


def test_comfyui_killed_with_sigkill_during_a_tp_run_leaves_no_worker(tiny_dir, tmp_path):
    """Its own server, killed with SIGKILL (no clean-up runs): the workers notice the closed
    connection and leave."""
    server = start_server(tmp_path / "base", tiny_dir)
    try:
        pids = run_info(run_ok(server, tp_prompt()))["worker_pids"]
        with server.events() as events:
            prompt_id = server.queue(tp_prompt(steps=LONG_STEPS), client_id=events.client_id)
            events.wait_for(lambda m: is_message("progress", prompt_id, max=LONG_STEPS)(m)
                            and m["data"]["value"] >= 2, timeout=300)
            server.kill()
    finally:
        server.stop()
    left = alive_after(pids, timeout=10)
    kill_leftovers(left)
    print(f"\n[fault] ComfyUI SIGKILLed during a TP run: workers {pids}, alive 10 s later {left}")
    assert left == [], "a worker outlived the killed ComfyUI by 10 s"
    count("faults survived")


# Installed beside the pack for the OOM test: the real FLUX transformer raises the device's out-of-memory
# error (torch.OutOfMemoryError, what CUDA raises) in its forward while the flag file exists.
OOM_INJECTOR = '''
import os

import diffusers
import torch

FLAG = os.environ["TPU_DIFFUSERS_TEST_OOM_FLAG"]
forward = diffusers.FluxTransformer2DModel.forward


def out_of_memory_while_flagged(self, *args, **kwargs):
    if os.path.exists(FLAG):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB (injected by the test)")
    return forward(self, *args, **kwargs)


diffusers.FluxTransformer2DModel.forward = out_of_memory_while_flagged
NODE_CLASS_MAPPINGS = {}
'''


def test_a_device_out_of_memory_error_frees_the_pipeline_says_what_to_try_and_the_next_prompt_works(tiny_dir,
                                                                                                    tmp_path):
    flag = tmp_path / "oom"
    injector = tmp_path / "base" / "custom_nodes" / "oom_injector"
    injector.mkdir(parents=True)
    (injector / "__init__.py").write_text(OOM_INJECTOR)
    server = start_server(tmp_path / "base", tiny_dir, env={"TPU_DIFFUSERS_TEST_OOM_FLAG": str(flag)})
    try:
        run_ok(server, sampler_prompt())
        flag.touch()
        node, message = failure(server.wait(server.queue(sampler_prompt(batch_size=2)), timeout=300))
        flag.unlink()
        print(f"\n[fault] injected device OOM: {message.strip()[:300]}")
        assert node == SAMPLER and "out of memory" in message.lower(), message
        assert "offload" in message and "batch" in message, message
        info = run_info(run_ok(server, sampler_prompt()))
        assert info["loaded"] is True  # what the pack held was freed: the next prompt loads afresh
        count("faults survived")
    finally:
        server.stop()
