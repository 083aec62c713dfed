"""Tensor parallelism on a CPU mesh: 2 ranks, gloo, workers launched with torchrun."""

import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from comfy_host import free_port
from processes import alive_after, launched_workers

from runtime.compile_cache import CompileSpec
from runtime.distributed import channel
from runtime.distributed.group import WORKER_SCRIPT, WorkerGroupError, root_cause
from runtime.distributed.mesh import ATTACH, MeshSpec
from runtime.distributed.sharding import local_bytes
from runtime.engine import Engine
from runtime.errors import UserInputError
from runtime.handle import PipelineHandle
from runtime.loading import inspect_source
from runtime.modes import ExecutionMode, Placement
from runtime.sampling import SampleRequest

TP_VS_SINGLE_ATOL = 1e-5  # measured ~4e-7: only the all-reduce order differs


def request(**overrides):
    values = dict(prompt="a cat sitting on a red chair", width=64, height=64, steps=2, guidance=2.0, seed=11)
    return SampleRequest(**{**values, **overrides})


def handle_for(tiny, name, **fields):
    source = tiny(name)
    return PipelineHandle(source=source, pipeline_class=inspect_source(source), **fields)




@pytest.fixture
def engine():
    engine = Engine()
    yield engine
    engine.unload()


@pytest.mark.parametrize("name", ["flux1-schnell", "flux2", "qwenimage"])
def test_two_ranks_give_the_single_process_image_and_each_holds_half_the_transformer(tiny, engine, name):
    single_engine = Engine()
    single = single_engine.generate(handle_for(tiny, name), request())
    full_bytes = local_bytes(single_engine.realise(handle_for(tiny, name))[0].pipe.transformer)

    result = engine.generate(handle_for(tiny, name, mesh=MeshSpec(chips=2)), request())
    torch.testing.assert_close(result.images, single.images, atol=TP_VS_SINGLE_ATOL, rtol=0)
    per_rank = result.info.transformer_bytes_per_rank
    assert result.info.world_size == 2 and per_rank[0] == per_rank[1]
    # each rank holds half of every sharded weight; what the TP plan leaves whole (embedders, norms,
    # rowwise biases) is on both, a large share of these tiny models and a small one of real ones
    assert result.info.sharded_fraction_per_rank == (0.5, 0.5)
    assert per_rank[0] < 0.8 * full_bytes, (per_rank, full_bytes)

    again = engine.generate(handle_for(tiny, name, mesh=MeshSpec(chips=2)), request(seed=12, steps=3))
    assert result.info.loaded and not again.info.loaded and again.info.load_seconds < result.info.load_seconds
    assert again.info.worker_pids == result.info.worker_pids  # the same warm workers


def test_compiled_mode_runs_inside_the_workers_on_the_sharded_transformer(tiny, engine, tmp_path):
    handle = handle_for(tiny, "flux1-schnell", mesh=MeshSpec(chips=2), mode=ExecutionMode.COMPILED,
                        compile=CompileSpec(cache_dir=str(tmp_path)))
    first = engine.generate(handle, request())
    again = engine.generate(handle, request(seed=19, steps=3))
    single = Engine().generate(handle_for(tiny, "flux1-schnell"), request())
    assert (first.info.compiled_now, again.info.compiled_now) == (True, False)
    torch.testing.assert_close(first.images, single.images, atol=2e-3, rtol=0)


def test_text_encoders_without_a_tp_plan_stay_whole_and_say_so(tiny, engine):
    result = engine.generate(handle_for(tiny, "flux1-schnell", mesh=MeshSpec(chips=2)), request())
    assert "text_encoder_2 (T5EncoderModel) has no TP plan in transformers: kept whole on every rank" \
        in result.info.notes


def test_bad_meshes_are_refused_before_anything_launches(tiny, engine, monkeypatch):
    with pytest.raises(UserInputError, match="SD3Transformer2DModel has no tensor-parallel plan"):
        engine.generate(handle_for(tiny, "sd3", mesh=MeshSpec(chips=2)), request())
    with pytest.raises(UserInputError, match="asks for 4096 chips but this host has"):
        engine.generate(handle_for(tiny, "flux1-schnell", mesh=MeshSpec(chips=4096)), request())
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    with pytest.raises(UserInputError, match=r"3 chips do not divide the transformer's 2 attention heads; "
                                             r"use one of \[1, 2\] chips"):
        engine.generate(handle_for(tiny, "flux1-schnell", mesh=MeshSpec(chips=3)), request())
    with pytest.raises(UserInputError, match="placement to 'device'"):
        engine.generate(handle_for(tiny, "flux1-schnell", mesh=MeshSpec(chips=2),
                                   placement=Placement.MODEL_CPU_OFFLOAD), request())
    assert engine.workers.current is None  # nothing was launched


def test_cancel_stops_every_rank_and_the_group_stays_warm(tiny, engine):
    handle = handle_for(tiny, "flux1-schnell", mesh=MeshSpec(chips=2))
    engine.generate(handle, request())

    class Cancelled(Exception):
        pass

    seen = []

    def cancel_at_step_2(done, total, what):
        seen.append(done)
        if what == "sampling" and done == 2:
            raise Cancelled

    with pytest.raises(Cancelled):
        engine.generate(handle, request(steps=500, seed=13), on_progress=cancel_at_step_2)
    assert seen[-1] <= 3  # stopped within one step of the cancel
    assert not engine.generate(handle, request(seed=14)).info.loaded


def test_cancel_while_the_workers_start_leaves_nothing_running(tiny, engine):
    class Cancelled(Exception):
        pass

    def cancel_while_starting(done, total, what):
        if what.startswith("starting") and launched_workers():
            raise Cancelled

    with pytest.raises(Cancelled):
        engine.generate(handle_for(tiny, "flux1-schnell", mesh=MeshSpec(chips=2)), request(),
                        on_progress=cancel_while_starting)
    assert engine.workers.current is None and launched_workers() == []


def test_a_killed_worker_fails_the_run_clearly_and_the_next_run_relaunches(tiny, engine):
    handle = handle_for(tiny, "flux1-schnell", mesh=MeshSpec(chips=2))
    first = engine.generate(handle, request())
    launcher, rank0, rank1 = first.info.worker_pids

    def kill_rank1_at_step_2(done, total, what):
        if what == "sampling" and done == 2:
            os.kill(rank1, signal.SIGKILL)

    start = time.monotonic()
    with pytest.raises(WorkerGroupError, match=r"worker rank 1 .*failed.*(-9|SIGKILL)"):
        engine.generate(handle, request(width=256, height=256, steps=10_000, seed=15), on_progress=kill_rank1_at_step_2)
    assert time.monotonic() - start < 120  # a bound against hangs, not a timing measurement
    assert alive_after((launcher, rank0, rank1)) == []

    again = engine.generate(handle, request(seed=16))
    assert again.info.loaded and set(again.info.worker_pids).isdisjoint(first.info.worker_pids)


def test_an_exception_on_one_rank_is_reported_with_its_rank_and_message(tmp_path):
    """torchrun's real failure report (not a copy of it): rank 1 raises, rank 0 is torn down."""
    script = tmp_path / "fails_on_rank_1.py"
    script.write_text(
        "import os, time\n"
        "from torch.distributed.elastic.multiprocessing.errors import record\n"
        "@record\n"
        "def main():\n"
        "    if os.environ['RANK'] == '1':\n"
        "        raise ValueError('out of memory on rank 1, as an example')\n"
        "    time.sleep(60)\n"
        "main()\n")
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    cause = root_cause(done.stdout + done.stderr)
    assert cause.startswith("worker rank 1 (local_rank: 1) failed (exit code 1"), cause
    assert "ValueError: out of memory on rank 1, as an example" in cause


def test_unload_stops_the_workers(tiny, engine):
    result = engine.generate(handle_for(tiny, "flux1-schnell", mesh=MeshSpec(chips=2)), request())
    assert engine.unload() >= 1
    assert alive_after(result.info.worker_pids) == []




def test_attach_to_workers_started_by_torchrun_on_two_hosts(tiny, engine, monkeypatch):
    """Two `torchrun --nnodes=2` "hosts" on loopback, as on a two-host TPU slice; the node attaches."""
    key, master_port, control = channel.new_key(), free_port(), f"127.0.0.1:{free_port()}"
    env = {**os.environ, channel.KEY_ENV: key}
    hosts = [subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nnodes=2", f"--node_rank={rank}",
                               "--nproc_per_node=1", "--master_addr=127.0.0.1", f"--master_port={master_port}",
                               str(WORKER_SCRIPT), "--control", control, "--stay"],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
              for rank in (0, 1)]
    try:
        mesh = MeshSpec(chips=2, workers=ATTACH, address=control, key=key)
        deadline = time.monotonic() + 180
        while True:  # the hosts take a while to start; the node would just be queued again
            try:
                result = engine.generate(handle_for(tiny, "flux1-schnell", mesh=mesh), request())
                break
            except ConnectionError:
                assert time.monotonic() < deadline and all(h.poll() is None for h in hosts)
                time.sleep(1)
        single = Engine().generate(handle_for(tiny, "flux1-schnell"), request())
        torch.testing.assert_close(result.images, single.images, atol=TP_VS_SINGLE_ATOL, rtol=0)
        assert "attached" in " ".join(result.info.notes)
        engine.unload()  # detaches; the workers stay up for the next client
        with pytest.raises(UserInputError, match="refused the key"):
            channel.connect(control, channel.new_key(), timeout=30)
        assert all(h.poll() is None for h in hosts)
        monkeypatch.setenv(channel.KEY_ENV, key)  # the key from the environment, not from the (shared) workflow
        without_key = MeshSpec(chips=2, workers=ATTACH, address=control)
        again = engine.generate(handle_for(tiny, "flux1-schnell", mesh=without_key), request(seed=18))
        assert again.info.loaded  # unload asked the attached workers to drop the pipeline
        assert key not in repr(mesh)
    finally:
        for host in hosts:
            os.killpg(host.pid, signal.SIGTERM)
        for host in hosts:
            host.wait(30)
