"""Every family fact lives in its family module: no family is named in runtime/ or nodes/ outside runtime/families/.

The names are derived from the families themselves (each Family.name, its module's name, the distinctive words of
its model classes), so a new family is covered the day it is registered. Code, strings, comments and docstrings
all count: a tooltip that lists families goes stale when one is added, as an `if` on a family does.
"""

import re
import sys
from pathlib import Path

from tpu_diffusers_runtime.families import FAMILIES

ROOT = Path(__file__).resolve().parent.parent
FAMILIES_FOLDER = ROOT / "runtime" / "families"
# Words of diffusers' pipeline class names that say what a pipeline does or what kind it is (Modular, Distilled), not
# which family it is.
TASK_WORDS = {"Pipeline", "Image", "Img2Img", "Edit", "Plus", "Fill", "Inpaint", "To", "Video", "Stable",
              "Diffusion", "Modular", "Distilled"}
# Parts of a class name that are ordinary words alone (MiniMaxH3ModularPipeline's "Max": max_area), named only together
# ("MiniMax", from the family's name)
ORDINARY_WORDS = {"Mini", "Max"}


def own_word(part: str) -> bool:
    """A part of a family or class name that is a name of its own: no task word, no bare number or letter."""
    return (len(part) > 2 and re.search("[A-Za-z]", part) and part.rstrip("0123456789") not in TASK_WORDS
            and part not in ORDINARY_WORDS)


def family_words() -> set[str]:
    """Lower-case words that name a family: its name and the parts of it, its module, its model classes' own words."""
    words = set()
    for family in FAMILIES:
        words.add(family.name)
        words.add(re.sub(r"[^A-Za-z0-9]", "", family.name))  # Z-Image -> ZImage
        words.update(part for part in re.split(r"[^A-Za-z0-9]+", family.name) if own_word(part))
        for model_class in family.model_classes:
            words.add(model_class)
            words.update(part for part in re.findall(r"[A-Z][a-z0-9]*", model_class) if own_word(part))
    words.update(name.rpartition(".")[2] for name, module in sys.modules.items()
                 if name.startswith("tpu_diffusers_runtime.families.") and hasattr(module, "FAMILY"))
    return {word.lower() for word in words}


def family_name_pattern() -> re.Pattern:
    # a word on its own: not inside a longer word ("Wan" in "wanted"), but "FLUX" in "FLUX.1" and "Flux" in
    # "FluxPipeline" count
    alternatives = "|".join(re.escape(word) for word in sorted(family_words(), key=len, reverse=True))
    return re.compile(rf"(?<![A-Za-z])(?i:{alternatives})(?![a-z])")


def family_name_hits() -> list[str]:
    pattern = family_name_pattern()
    hits = []
    for folder in ("runtime", "nodes"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if FAMILIES_FOLDER in path.parents:
                continue
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if found := pattern.search(line):
                    hits.append(f"{path.relative_to(ROOT)}:{number}: {found[0]!r} in {line.strip()[:100]}")
    return hits


def test_the_family_words_cover_every_family():
    words = family_words()
    for family in FAMILIES:
        assert family.name.lower() in words
    assert {"flux", "kontext", "klein", "qwen", "sd3", "sdxl", "zimage", "z-image", "wan"} <= words


def test_the_pattern_finds_a_family_name_and_not_an_ordinary_word():
    pattern = family_name_pattern()
    assert pattern.search("a FLUX.1 model") and pattern.search("FluxPipeline") and pattern.search("from . import wan")
    assert not pattern.search("what the user wanted") and not pattern.search("a workflow")


def test_no_family_is_named_outside_its_family_module():
    hits = family_name_hits()
    assert not hits, f"{len(hits)} family names outside runtime/families/ (say it generically, or make it a " \
                     "Family field):\n" + "\n".join(hits)
