"""tools/verify_device.py, the one command that proves the pack on a device: each matrix cell says
what it did (a fallback or a refusal is not a pass) and is compared with the host CPU's reference
(an output too far from it fails), a child process that dies fails the cells it never reported, and
the report fills every cell; --budget bounds the run; --python-here refuses an interpreter that
lacks what the pack needs, naming it. The whole quick run (`bash
scripts/verify_device.sh --device cpu --quick`) takes too long for this suite on 2 cores; CI runs it
as its own step."""

import dataclasses
import os
import re
import subprocess
import sys
import time
import zipfile

import pytest
import verify_device

from tpu_diffusers_runtime.engine import Engine


@pytest.fixture(scope="module")
def references(tiny_dir, tmp_path_factory):
    """The CPU references of the models the cells below run, computed as the tool's reference process does."""
    models = {family: str(tiny_dir / f"tiny-{family}") for family in ("flux1-schnell", "flux2", "wan22-ti2v-5b")}
    folder = tmp_path_factory.mktemp("references")
    return {record.pop("family"): record for record in verify_device.compute_references({"tiny": models}, folder)}


@pytest.fixture(scope="module")
def cells(tiny_dir, tmp_path_factory, references):
    """Real records: cells run here (compared with the CPU references, the TP cell with the eager cell's output
    too), and two in a child process that dies after the first."""
    models = {"tiny": {family: str(tiny_dir / f"tiny-{family}") for family in verify_device.FAMILIES}}
    one_rank = tmp_path_factory.mktemp("one-rank")
    engine = Engine()

    def run(family, cell):
        reference = references.get(family, {"error": "not computed by this test"})
        return verify_device.run_cell(engine, family, cell, "tiny", models["tiny"][family], "cpu", reference,
                                      one_rank / f"{family}.npy")

    records = {cell: run(family, cell) for family, cell in (
        ("flux1-schnell", "eager"), ("flux1-schnell", "fused_eager"), ("sd3", "tp"), ("flux2", "image_task"))}
    records["flux tp"] = run("flux1-schnell", "tp")  # after the eager cell: compared with its output too
    # a video model: TI2V-5B's image input is image to video (from_pipe); cells that do not apply load nothing
    records["video"] = run("wan22-ti2v-5b", "image_task")
    records["no image task"] = run("wan22-t2v-a14b", "image_task")
    records["n/a"] = run("flux1-schnell", "context_parallel")
    engine.unload()
    ctx = verify_device.Context(device="cpu", quick=True, work=tmp_path_factory.mktemp("verify"),
                                references={"tiny": {"flux1-schnell": references["flux1-schnell"]}})
    # the model table lacks sd3: the child raises KeyError on its second cell and exits
    survived, died = verify_device.run_cells(ctx, "dies", [["flux1-schnell", "eager", "tiny"], ["sd3", "eager", "tiny"]],
                                             {"tiny": {"flux1-schnell": models["tiny"]["flux1-schnell"]}})
    return {**records, "survived": survived, "died": died}


def test_a_cell_records_what_ran_not_what_was_asked(cells):
    eager, fused, tp = cells["eager"], cells["fused_eager"], cells["tp"]
    assert eager["status"] == "pass" and eager["mode"] == "eager" and eager["warm_seconds"] > 0
    assert eager["compiled_now"] == [None, None] and verify_device.cache_word(eager) == "no cache lookups"
    assert fused["status"] == "fallback" and fused["mode"].startswith("eager (fused eager needs TorchTPU")
    assert tp["status"] == "refused" and "has no tensor-parallel plan" in tp["error"]
    image = cells["image_task"]  # FLUX.2: the first run's image as the reference of an edit, on the loaded pipeline
    assert image["status"] == "pass" and image["loaded"] is True, image


def test_a_video_model_makes_frames_and_cells_that_do_not_apply_say_why(cells):
    video = cells["video"]  # 5 frames x 64 x 64 x 3, then image to video from its first frame on the loaded pipeline
    assert video["status"] == "pass" and video["loaded"] is True and video["mode"] == "eager", video
    assert cells["no image task"] == {"family": "wan22-t2v-a14b", "cell": "image_task", "size": "tiny",
                                      "status": "n/a", "reason": "this WanPipeline takes no image: it runs "
                                                                 "text2video only"}
    assert cells["n/a"]["status"] == "n/a" and "an image model" in cells["n/a"]["reason"]
    assert verify_device.SIZES["tiny"].frames(verify_device.family_for("WanPipeline")) == 5
    wan = {model: title for model, title in verify_device.FAMILIES.items() if title.startswith("Wan")}
    assert wan == {"wan22-t2v-a14b": "Wan 2.2 A14B", "wan22-ti2v-5b": "Wan 2.2 TI2V-5B"}


def test_every_cell_that_ran_is_compared_with_the_cpu_reference_and_parallel_cells_with_one_rank(cells):
    """On a CPU the reference is the same device: the differences are rounding at most, and still measured."""
    float32 = {"dtype": "float32", **verify_device.TOLERANCES["float32"]}
    reference = "the CPU reference (float32)"
    for name in ("eager", "fused_eager", "image_task", "flux tp", "video"):
        record = cells[name]
        assert record["status"] in ("pass", "fallback") and record["tolerance"] == float32, record
        assert record["compared"][0]["with"] == reference and record["compared"][0]["max_abs_diff"] < 1e-5, record
    assert [c["with"] for c in cells["image_task"]["compared"]] == [reference,
                                                                     "the CPU reference's image run (float32)"]
    tp = cells["flux tp"]  # 1 replica of 2 ranks, checked against the reference and the eager cell's output
    assert tp["world_size"] == 2 and [c["with"] for c in tp["compared"]] == [
        reference, "one rank (this device's eager cell)"]
    assert all(c["max_abs_diff"] < 1e-5 and c["mean_abs_diff"] < 1e-6 for c in tp["compared"]), tp
    assert "compared" not in cells["tp"]  # refused (SD3 has no TP plan): nothing ran, nothing to compare


def test_a_corrupted_output_fails_its_cell_and_the_report_gives_the_tolerance_and_the_difference(tiny, references,
                                                                                                  tmp_path):
    """The outputs of a real eager run, judged as the tool judges every cell: as they are they pass; a patch of the
    image off by 0.05, a black image, or a missing reference fail the cell, and the report says by how much."""
    source = tiny("flux1-schnell")
    engine = Engine()
    handle = verify_device.cell_handle(source, "eager", "cpu")
    first, warm = (engine.generate(handle, request) for request in verify_device.cell_requests(
        verify_device.family_for(handle.model_class), "tiny"))
    engine.unload()

    def judged(images, reference=references["flux1-schnell"]):
        output = dataclasses.replace(first, images=images)
        record = {"family": "flux1-schnell", "cell": "eager", "size": "tiny", "first_seconds": 1.0}
        return verify_device.judge(engine, record, handle, output, warm, reference, tmp_path / "none.npy", 2)

    assert judged(first.images)["status"] == "pass"
    patched = first.images.clone()
    patched[0, :8, :8] += 0.05
    off, black = judged(patched), judged(first.images * 0)
    assert off["status"] == black["status"] == "fail"
    tolerance = "(tolerance for float32: max abs diff 5.00e-03, mean abs diff 5.00e-04)"
    assert off["error"] == f"differs from the CPU reference (float32): max abs diff 5.00e-02, mean abs diff " \
                           f"{0.05 * 64 / 4096:.2e} {tolerance}", off
    assert black["compared"][0]["mean_abs_diff"] == pytest.approx(float(first.images.mean()), rel=1e-5)
    missing = judged(first.images, {"error": "no CPU reference: the process exited with code 1: KeyError"})
    assert missing["status"] == "fail" and missing["error"] == \
        "no CPU reference to compare with: no CPU reference: the process exited with code 1: KeyError"

    report = tmp_path / "report.md"
    matrix = [{"family": family, "cell": cell, "size": "tiny", "status": "n/a", "reason": "-"}
              for family in verify_device.FAMILIES for cell in verify_device.CELLS if (family, cell) != (
                  "flux1-schnell", "eager")] + [off]
    suite = {"scope": "none", "ran": False, "exit_code": None, "summary": "not run", "failed": []}
    cache = {"size": "tiny", "cold": off, "warm": None, "reused": False}
    verify_device.write_report(report, verify_device.Context(device="cpu", quick=True, work=tmp_path), {}, suite,
                               matrix, ["tiny"], cache, [], 60.0, "cmd", "here")
    text = report.read_text()
    assert f"- FLUX.1 / eager (tiny): {off['error']}" in text and f"- FLUX.1 / eager: fail: {off['error']}" in text
    assert "Allowed, by the dtype the cell ran in: float32: max abs diff 5.00e-03, mean abs diff 5.00e-04; " \
           "bfloat16: max abs diff 2.50e-01, mean abs diff 1.50e-02." in text


@pytest.mark.parametrize("device, kind, ranks", [("tpu", "v5e", 4), ("tpu", "v6e", 4), ("tpu", "v4", 2),
                                                 ("tpu", "v5p", 2), ("tpu", "v7", 2), ("cuda", None, 2),
                                                 ("cpu", None, 2)])
def test_the_parallel_cells_are_sized_for_what_the_chip_type_can_launch(tiny, device, kind, ranks):
    """TorchTPU 0.2.0 launches no 2-rank group on a v5e or v6e host (a fake chip type here: no TPU): the TP and
    context parallel cells run 2 replicas of 2 ranks there; the quick benchmarks' tiny model cannot shard 4 ways."""
    from tpu_diffusers_runtime.distributed.mesh import mesh_shape

    assert verify_device.parallel_ranks(device, kind) == ranks
    source = tiny("wan22-ti2v-5b")
    for cell, shape in (("tp", (ranks // 2, 1, 2)), ("context_parallel", (ranks // 2, 2, 1))):
        mesh = verify_device.cell_handle(source, cell, "cpu", ranks).mesh
        assert (mesh.chips, mesh_shape(mesh, mesh.chips)) == (ranks, shape)
    plan = verify_device.benchmark_plan(True, verify_device.ROOT / "tiny-flux1-schnell", 8, True, ranks)
    if ranks == 2:
        assert plan["bench_tp.py"][-2:] == ["--ranks", "2"] and plan["bench_dp.py"][-4:] == ["--ranks", "2",
                                                                                              "--batch", "2"]
    else:
        assert plan["bench_tp.py"] == plan["bench_dp.py"] == (
            "not run: the fewest ranks above one TorchTPU launches on this chip type are 4, and the tiny model's 2 "
            "attention heads do not divide by 4; without --quick it runs on the bench model")
        assert verify_device.benchmark_plan(False, verify_device.ROOT / "x", 8, True, ranks)["bench_tp.py"] == [
            "--ranks", "4"]


def test_cells_a_dead_child_never_reported_fail_with_its_last_words(cells):
    assert cells["survived"]["status"] == "pass"
    died = cells["died"]
    assert (died["family"], died["cell"], died["status"]) == ("sd3", "eager", "fail")
    assert "exited with code 1" in died["error"] and "KeyError: 'sd3'" in died["error"]


def test_the_report_fills_every_cell_and_shows_fallbacks_and_failures_as_such(cells, tmp_path):
    like = {"eager": "eager", "fused_eager": "fused_eager", "tp": "tp", "image_task": "image_task",
            "context_parallel": "n/a"}  # others: the failure
    matrix = [{**cells[like.get(cell, "died")], "family": family, "cell": cell}
              for family in verify_device.FAMILIES for cell in verify_device.CELLS]
    suite = {"scope": "contract", "ran": True, "exit_code": 0, "summary": "12 passed", "failed": []}
    cache = {"size": "tiny", "cold": matrix[0], "warm": None, "reused": False}
    ctx = verify_device.Context(device="cpu", quick=True, work=tmp_path)
    report = tmp_path / "report.md"
    verify_device.write_report(report, ctx, {"torch": "x"}, suite, matrix, ["tiny"], cache, [], 60.0, "cmd", "here")
    text = report.read_text()

    titles = "|".join(re.escape(title) for title in verify_device.FAMILIES.values())
    rows = re.findall(rf"^\| ({titles}) \|(.*)\|$", text, re.M)
    assert [family for family, _ in rows] == list(verify_device.FAMILIES.values())
    for _, row in rows:
        cell_texts = [c.strip() for c in row.split("|")]
        assert len(cell_texts) == len(verify_device.CELLS) and all(cell_texts), row
        assert cell_texts[0].startswith("pass ") and cell_texts[1].startswith("fallback ")
        assert cell_texts[2:5] == ["**FAIL**"] * 3 and cell_texts[5] == "refused" and cell_texts[6].startswith("pass")
        assert cell_texts[7] == "n/a"
    failed = len(verify_device.FAMILIES) * 3
    assert f"**{failed + 1} failure(s)**:" in text  # the failed cells, and the compile cache never reused
    assert "### bench models: not run (--sizes tiny)" in text
    assert "### tiny models (64x64, 2 steps; video: 5, 9 frames, 3 steps)" in text  # Wan 4k + 1, LTX-2 8k + 1
    assert f"- {verify_device.FAMILIES['flux1-schnell']} / context parallel: n/a: an image model: " in text


def test_the_budget_skips_what_would_start_after_it_and_stops_what_runs_with_its_children(tmp_path):
    ctx = verify_device.Context(device="cpu", quick=True, work=tmp_path, budget_minutes=0.05,
                                deadline=time.perf_counter() + 3)
    # the child starts a grandchild that would outlive it: both must be gone when the budget ends
    pid_file = tmp_path / "grandchild.pid"
    code = (f"import subprocess, time; p = subprocess.Popen(['sleep', '60']); "
            f"open({str(pid_file)!r}, 'w').write(str(p.pid)); time.sleep(60)")
    start = time.perf_counter()
    stopped = verify_device.run_logged(ctx, "sleeper", [sys.executable, "-c", code])
    assert time.perf_counter() - start < 10 and stopped.code is None
    assert stopped.budget.startswith("stopped after") and "--budget of 0.05 min ran out" in stopped.budget
    grandchild = int(pid_file.read_text())
    time.sleep(0.5)
    assert not os.path.exists(f"/proc/{grandchild}") or "Z" in open(f"/proc/{grandchild}/stat").read().split()[2]
    never = verify_device.run_logged(ctx, "late", [sys.executable, "-c", "pass"])
    assert never.budget == "not run: the --budget of 0.05 min was spent"
    assert [how for _, _, how in ctx.spent] == [stopped.budget, never.budget]


def test_without_comfyui_or_a_second_chip_the_benchmarks_say_what_does_not_run():
    model = verify_device.ROOT / ".comfyui" / "tiny-models" / "tiny-flux1-schnell"  # named, not read
    plan = verify_device.benchmark_plan(False, model, 1, has_comfyui=False)
    assert plan["bench_vs_diffusers.py"] == ["--ours", "engine"]
    assert "no ComfyUI is importable" in plan["bench_native.py"]
    assert plan["bench_tp.py"] == plan["bench_dp.py"] == "not run: it needs 2 chips, this host has 1"
    assert plan["bench_compile.py"] == plan["bench_lora.py"] == plan["bench_single_file.py"] == []
    on_cpu = verify_device.benchmark_plan(True, model, None, has_comfyui=True)
    assert all(isinstance(args, list) and "--ours" not in args for args in on_cpu.values())


def test_python_here_refuses_an_interpreter_without_the_packs_packages_and_names_them(tmp_path):
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "bare")], check=True)
    carried = tmp_path / "wheels"  # one pure wheel, so the run does not depend on the pack's own wheels/
    carried.mkdir()
    with zipfile.ZipFile(carried / "tpu_test_dummy-1.0-py3-none-any.whl", "w") as wheel:
        wheel.writestr("tpu_test_dummy/__init__.py", "")
    script = verify_device.ROOT / "scripts" / "verify_device.sh"
    env = {**os.environ, "PYTHON": str(tmp_path / "bare" / "bin" / "python")}

    def verify(*args):
        return subprocess.run(["bash", str(script), "--python-here", "--wheels", str(carried), *args], env=env,
                              capture_output=True, text=True, timeout=60)

    ran = verify("--device", "cpu")
    assert ran.returncode == 1, ran.stderr
    assert "unpacked into" in ran.stdout and "tpu_test_dummy-1.0-py3-none-any.whl" in ran.stdout
    for requirement in ("diffusers>=0.42.1", "transformers>=4.57", "torch", "sentencepiece", "protobuf"):
        assert f"  - {requirement}: `import " in ran.stderr
    assert "bash scripts/device_wheels.sh wheels" in ran.stderr and "docs/device_check.md" in ran.stderr
    assert "[verify]" not in ran.stdout  # it stopped before the run
    other = "cp39" if sys.version_info[:2] != (3, 9) else "cp38"
    (carried / f"sentencepiece-0.2.3-{other}-{other}-manylinux_2_28_x86_64.whl").write_bytes(b"")
    ran = verify()
    assert ran.returncode == 1 and "built for another Python" in ran.stderr and "PYTHON_VERSION=" in ran.stderr


def test_the_upsampling_probe_runs_in_a_child_and_the_report_shows_it(tiny_dir, tmp_path):
    """Nearest upsampling (TorchTPU's SDXL smoke test: "missing op upsample_nearest2d.out") and the SDXL VAE
    decode, in a child process, compared with the CPU; here the device is the CPU, so both must pass exactly."""
    ctx = verify_device.Context(device="cpu", quick=True, work=tmp_path)
    probe = verify_device.run_upsampling_probe(ctx, str(tiny_dir / f"tiny-{verify_device.UPSAMPLE_PROBE_FAMILY}"))
    assert set(probe) == set(verify_device.UPSAMPLE_PROBES)
    assert all(record["status"] == "pass" and record["max_abs_diff"] == 0 for record in probe.values()), probe
    lines = verify_device.probe_lines({**probe, "sdxl_vae_decode": {"status": "missing op", "op": "aten::x.out",
                                                                    "error": "NotImplementedError: ..."}})
    assert "| upsample_nearest2d | pass | max abs diff 0.00e+00 |" in lines
    assert "| sdxl_vae_decode | missing op | aten::x.out NotImplementedError: ... |" in lines


def test_the_int8_benchmark_runs_in_the_quick_cpu_form_and_the_report_shows_its_ratios(tmp_path):
    """W8A8, weight-only and bf16 side by side (benchmarks/bench_int8_matmul.py), as CI's quick CPU run plans it: it
    exits 0 and the report carries its table, each mode's time per forward as a ratio to bf16's and how far its output
    is from bf16's. Without --quick it runs at FLUX.1's width, compiled too."""
    model = verify_device.ROOT / ".comfyui" / "tiny-models" / "tiny-flux1-schnell"  # named, not read
    assert verify_device.benchmark_plan(False, model, 1, has_comfyui=True)["bench_int8_matmul.py"] == ["--compile"]
    quick = verify_device.benchmark_plan(True, model, None, has_comfyui=True)["bench_int8_matmul.py"]
    ctx = verify_device.Context(device="cpu", quick=True, work=tmp_path)
    [bench] = verify_device.run_benchmarks(ctx, {"bench_int8_matmul.py": quick})
    assert bench["exit_code"] == 0, bench["stderr"]
    rows = re.findall(r"^\| (.+?) \| no \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \|$", bench["stdout"], re.M)
    assert [row[0] for row in rows] == ["bf16", "weight-only (dequantized per layer)", "W8A8 (int8 x int8)"], rows
    assert rows[0][2:] == ("1.00", "0.0000") and all(0 < float(row[3]) < 0.05 for row in rows[1:]), rows
    suite = {"scope": "none", "ran": False, "exit_code": None, "summary": "not run", "failed": []}
    cache = {"size": "tiny", "cold": {"status": "not run"}, "warm": None, "reused": False}
    report = tmp_path / "report.md"
    verify_device.write_report(report, ctx, {}, suite, [], [], cache, [bench], 60.0, "cmd", "here")
    assert "### bench_int8_matmul.py: ok" in report.read_text()
    assert all(f"| {row[0]} | no | {row[1]} | {row[2]} | {row[3]} |" in report.read_text() for row in rows)
