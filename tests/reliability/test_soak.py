"""Soak: 50 prompts through one server, alternating two families (FLUX.1-schnell, SD3: the pipeline
cache holds one, so every prompt loads its family again), three sizes, batch 1 and 2, eager and
compiled. Nothing may be lost (every image written, at its size, as many as the batch) and the
server must not grow (RSS after prompt 50 within 10% of after prompt 10) or compile a shape twice.

Compiled runs: every other FLUX.1 prompt, at two shapes only (64x64 and 96x64, batch 1), both
first met by prompt 5. A compile costs 20-90 s on two CPU cores, so two shapes show "compiles
once per shape, reused after, also after the pipeline was evicted and loaded again" for about
two minutes; batch 2 and the third size run eager. (The warm-up test in test_faults.py warms the
same two shapes, so the suite compiles two shapes in all.)
"""

from __future__ import annotations

import pytest

from harness import REPORT
from serving import image_sizes, run_info, run_ok, sampler_prompt, with_compile

PROMPTS = 50
FAMILIES = ("tiny-flux1-schnell", "tiny-sd3")
SIZES = ((64, 64), (96, 64), (64, 128))
COMPILED_SHAPES = ((64, 64, 1), (96, 64, 1))  # (width, height, batch)
RSS_AFTER = (10, 50)  # prompts after which the server's RSS is compared


def plan(i: int) -> tuple[str, int, int, int, str]:
    """(model, width, height, batch, mode) of prompt i (from 0)."""
    model = FAMILIES[i % 2]
    if model == "tiny-flux1-schnell" and (i // 2) % 2 == 0:
        width, height, batch = COMPILED_SHAPES[(i // 4) % 2]
        return model, width, height, batch, "compiled"
    width, height = SIZES[i % 3]
    return model, width, height, 1 + (i // 3) % 2, "eager"


@pytest.fixture(scope="module")
def soak(server):
    """Runs the 50 prompts; returns one record per prompt (its plan, run info, image sizes) and the
    server's RSS after prompts 10 and 50."""
    records, rss = [], {}
    for i in range(PROMPTS):
        model, width, height, batch, mode = plan(i)
        prompt = sampler_prompt(model, width, height, batch_size=batch, mode=mode)
        if mode == "compiled":
            prompt = with_compile(prompt, server)
        entry = run_ok(server, prompt, timeout=600)
        info = run_info(entry)
        records.append({"i": i, "model": model, "shape": (width, height, batch), "mode": mode, "info": info,
                        "sizes": image_sizes(server, entry)})
        print(f"[soak {i + 1:2d}] {model} {width}x{height} x{batch} {mode}: loaded {info['loaded']}, "
              f"compiled now {info['compiled_now']}, {info['sample_seconds']:.2f}s", flush=True)
        if i + 1 in RSS_AFTER:
            rss[i + 1] = server.rss_bytes()
    first, last = (rss[n] for n in RSS_AFTER)
    growth = (last - first) / first
    REPORT["soak RSS after prompt 10 / 50"] = f"{first / 2**20:.0f} MiB / {last / 2**20:.0f} MiB ({growth:+.1%})"
    print(f"\n[soak] server RSS after prompt {RSS_AFTER[0]}: {first / 2**20:.0f} MiB, after prompt {RSS_AFTER[1]}: "
          f"{last / 2**20:.0f} MiB ({growth:+.1%})")
    return records, rss


def test_soak_writes_every_image_at_its_size(soak):
    records, _ = soak
    assert len(records) == PROMPTS
    for record in records:
        width, height, batch = record["shape"]
        assert record["sizes"] == [(width, height)] * batch, record


def test_soak_alternates_what_it_promises(soak):
    """The plan really covers two families reloaded in turn, three sizes, both batch sizes, both modes."""
    records, _ = soak
    assert {r["model"] for r in records} == set(FAMILIES)
    assert {r["shape"][:2] for r in records} == set(SIZES)
    assert {r["shape"][2] for r in records} == {1, 2}
    assert {r["mode"] for r in records} == {"eager", "compiled"}


def test_soak_compiles_each_shape_at_most_once(soak):
    """After a shape's first compiled run nothing compiles again (also after its pipeline was evicted
    and loaded again); eager runs never report a compile."""
    records, _ = soak
    seen = set()
    for record in records:
        info = record["info"]
        if record["mode"] == "eager":
            assert info["compiled_now"] is None, record
            continue
        assert info["mode"].startswith("compiled"), record
        if record["shape"] in seen:
            assert info["compiled_now"] is False, f"prompt {record['i'] + 1} compiled {record['shape']} again"
        seen.add(record["shape"])
    assert seen == set(COMPILED_SHAPES)


def test_soak_server_memory_stays_flat(soak):
    _, rss = soak
    first, last = (rss[n] for n in RSS_AFTER)
    assert abs(last - first) <= 0.10 * first, f"RSS {first / 2**20:.0f} MiB -> {last / 2**20:.0f} MiB"
