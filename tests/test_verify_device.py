"""tools/verify_device.py, the one command that proves the pack on a device: each matrix cell says
what it did (a fallback or a refusal is not a pass), a child process that dies fails the cells it
never reported, and the report fills every cell. The whole quick run (`bash scripts/verify_device.sh
--device cpu --quick`) takes too long for this suite on 2 cores; CI runs it as its own step."""

import re

import pytest
import verify_device

from tpu_diffusers_runtime.engine import Engine


@pytest.fixture(scope="module")
def cells(tiny_dir, tmp_path_factory):
    """Real records: three cells run here, and two in a child process that dies after the first."""
    models = {"tiny": {family: str(tiny_dir / f"tiny-{family}") for family in verify_device.FAMILIES}}
    engine = Engine()
    records = {cell: verify_device.run_cell(engine, family, cell, "tiny", models["tiny"][family], "cpu")
               for family, cell in (("flux1-schnell", "eager"), ("flux1-schnell", "fused_eager"), ("sd3", "tp"))}
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


def test_cells_a_dead_child_never_reported_fail_with_its_last_words(cells):
    assert cells["survived"]["status"] == "pass"
    died = cells["died"]
    assert (died["family"], died["cell"], died["status"]) == ("sd3", "eager", "fail")
    assert "exited with code 1" in died["error"] and "KeyError: 'sd3'" in died["error"]


def test_the_report_fills_every_cell_and_shows_fallbacks_and_failures_as_such(cells, tmp_path):
    like = {"eager": "eager", "fused_eager": "fused_eager", "tp": "tp"}  # the other columns take the failure
    matrix = [{**cells[like.get(cell, "died")], "family": family, "cell": cell}
              for family in verify_device.FAMILIES for cell in verify_device.CELLS]
    suite = {"scope": "contract", "exit_code": 0, "summary": "12 passed", "failed": []}
    cache = {"cold": matrix[0], "warm": None, "reused": False}
    ctx = verify_device.Context(device="cpu", quick=True, work=tmp_path)
    report = tmp_path / "report.md"
    verify_device.write_report(report, ctx, {"torch": "x"}, suite, matrix, ["tiny"], cache, [], 60.0, "cmd")
    text = report.read_text()

    rows = re.findall(r"^\| (FLUX\.1|SD3\/SD3\.5|FLUX\.2|QwenImage) \|(.*)\|$", text, re.M)
    assert [family for family, _ in rows] == list(verify_device.FAMILIES.values())
    for _, row in rows:
        cell_texts = [c.strip() for c in row.split("|")]
        assert len(cell_texts) == len(verify_device.CELLS) and all(cell_texts), row
        assert cell_texts[0].startswith("pass ") and cell_texts[1].startswith("fallback ")
        assert cell_texts[2:5] == ["**FAIL**"] * 3 and cell_texts[5] == "refused"
    failed = len(verify_device.FAMILIES) * 3
    assert f"**{failed + 1} failure(s)**:" in text  # the failed cells, and the compile cache never reused
    assert "### bench models: not run (--quick)" in text
