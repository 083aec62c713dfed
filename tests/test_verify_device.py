"""tools/verify_device.py, the one command that proves the pack on a device: each matrix cell says
what it did (a fallback or a refusal is not a pass), a child process that dies fails the cells it
never reported, and the report fills every cell; --budget bounds the run; --python-here refuses an
interpreter that lacks what the pack needs, naming it. The whole quick run (`bash
scripts/verify_device.sh --device cpu --quick`) takes too long for this suite on 2 cores; CI runs it
as its own step."""

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
def cells(tiny_dir, tmp_path_factory):
    """Real records: four cells run here, and two in a child process that dies after the first."""
    models = {"tiny": {family: str(tiny_dir / f"tiny-{family}") for family in verify_device.FAMILIES}}
    engine = Engine()
    records = {cell: verify_device.run_cell(engine, family, cell, "tiny", models["tiny"][family], "cpu")
               for family, cell in (("flux1-schnell", "eager"), ("flux1-schnell", "fused_eager"), ("sd3", "tp"),
                                    ("flux2", "image_task"))}
    # a video model: TI2V-5B's image input is image to video (from_pipe); cells that do not apply load nothing
    records["video"] = verify_device.run_cell(engine, "wan22-ti2v-5b", "image_task", "tiny",
                                              models["tiny"]["wan22-ti2v-5b"], "cpu")
    records["no image task"] = verify_device.run_cell(engine, "wan22-t2v-a14b", "image_task", "tiny",
                                                      models["tiny"]["wan22-t2v-a14b"], "cpu")
    records["n/a"] = verify_device.run_cell(engine, "flux1-schnell", "context_parallel", "tiny",
                                            models["tiny"]["flux1-schnell"], "cpu")
    engine.unload()
    ctx = verify_device.Context(device="cpu", quick=True, work=tmp_path_factory.mktemp("verify"))
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
    assert "### tiny models (64x64, 2 steps; video: 5 frames, 3 steps)" in text
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
