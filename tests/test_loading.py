import json
import shutil

import pytest

from tpu_diffusers_runtime import loading
from tpu_diffusers_runtime.device import device_info
from tpu_diffusers_runtime.errors import ModelLoadError, UserInputError
from tpu_diffusers_runtime.handle import PipelineHandle
from tpu_diffusers_runtime.loading import inspect_source, load_pipeline
from tpu_diffusers_runtime.pipeline_cache import PipelineCache
from tpu_diffusers_runtime.sources import list_model_folders, resolve_model_folder

CPU = device_info("cpu")


def test_lists_pipeline_folders_under_the_model_roots(tiny_dir):
    names = list_model_folders([str(tiny_dir), "/does/not/exist"])
    assert "tiny-flux1-schnell" in names and "tiny-sd3" in names
    assert not any("/" in n for n in names)  # component subfolders are not models


@pytest.mark.parametrize("name", ["../models", "tiny-sd3/../../x", "/etc", "..", ""])
def test_model_names_cannot_escape_the_model_folders(tiny_dir, name):
    with pytest.raises(UserInputError):
        resolve_model_folder(name, [str(tiny_dir)])


def test_missing_model_folder_names_the_folder(tiny_dir):
    with pytest.raises(UserInputError, match="model folder 'nope' was not found"):
        resolve_model_folder("nope", [str(tiny_dir)])
    assert resolve_model_folder("tiny-sd3", [str(tiny_dir)]) == str(tiny_dir / "tiny-sd3")


def test_each_family_is_detected_from_model_index(tiny):
    assert inspect_source(tiny("flux1-schnell")) == "FluxPipeline"
    assert inspect_source(tiny("sd3")) == "StableDiffusion3Pipeline"
    assert inspect_source(tiny("flux2")) == "Flux2Pipeline"
    assert inspect_source(tiny("qwenimage")) == "QwenImagePipeline"


@pytest.fixture
def copy_of(tiny, tmp_path):
    def make(name):
        dest = tmp_path / name
        shutil.copytree(tiny(name), dest)
        return dest
    return make


def test_folder_without_model_index_is_not_a_pipeline(tmp_path):
    with pytest.raises(UserInputError, match="no model_index.json"):
        inspect_source(str(tmp_path))


def test_unsupported_pipeline_class_names_the_supported_ones(copy_of):
    folder = copy_of("flux1-schnell")
    index = json.loads((folder / "model_index.json").read_text())
    index["_class_name"] = "StableDiffusionPipeline"  # SD 1.x/2.x: not a family of the pack
    (folder / "model_index.json").write_text(json.dumps(index))
    with pytest.raises(UserInputError, match="StableDiffusionPipeline.*Supported pipelines: FLUX.1"):
        inspect_source(str(folder))


def test_component_from_another_library_is_refused(copy_of):
    folder = copy_of("flux1-schnell")
    index = json.loads((folder / "model_index.json").read_text())
    index["vae"] = ["os", "system"]
    (folder / "model_index.json").write_text(json.dumps(index))
    with pytest.raises(UserInputError, match="library 'os'"):
        inspect_source(str(folder))


def test_what_loads_is_the_model_index_that_was_checked_even_if_the_file_changes_after(copy_of, monkeypatch):
    """Rewritten right after it was read, as by someone racing the loader: the change must not be used."""
    folder = copy_of("flux1-schnell")
    read_model_index = loading.read_model_index
    reads = []

    def read_then_rewrite(source, is_folder):
        index = read_model_index(source, is_folder)
        reads.append(source)
        (folder / "model_index.json").write_text(json.dumps({**index, "vae": ["os", "system"],
                                                             "image_encoder": ["os", "system"]}))
        return index

    monkeypatch.setattr(loading, "read_model_index", read_then_rewrite)
    pipe = load_pipeline(PipelineHandle.of(source=str(folder), model_class="FluxPipeline"), CPU)
    assert reads == [str(folder)]
    assert type(pipe.vae).__name__ == "AutoencoderKL" and pipe.image_encoder is None


def test_a_component_from_another_library_is_refused_at_load_too(copy_of):
    """The folder may change after the Loader checked it; the load checks what it reads."""
    folder = copy_of("flux1-schnell")
    handle = PipelineHandle.of(source=str(folder), model_class=inspect_source(str(folder)))
    index = json.loads((folder / "model_index.json").read_text())
    (folder / "model_index.json").write_text(json.dumps({**index, "vae": ["os", "system"]}))
    with pytest.raises(UserInputError, match="library 'os'"):
        load_pipeline(handle, CPU)


def test_truncated_weights_are_reported_before_loading(copy_of):
    folder = copy_of("flux1-schnell")
    weights = next((folder / "transformer").glob("*.safetensors"))
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(ModelLoadError, match="transformer/.*truncated or corrupt"):
        inspect_source(str(folder))


def test_missing_component_folder_is_reported(copy_of):
    folder = copy_of("flux1-schnell")
    shutil.rmtree(folder / "vae")
    with pytest.raises(ModelLoadError, match="no 'vae' folder"):
        inspect_source(str(folder))


def test_hub_id_offline_says_how_to_get_the_folder():
    with pytest.raises(UserInputError, match="hf download someone/some-model"):
        inspect_source("someone/some-model")


def test_a_relative_path_is_treated_as_a_hub_id_never_as_a_local_folder(tiny_dir, monkeypatch):
    monkeypatch.chdir(tiny_dir.parent)  # "diffusers/tiny-sd3" is a real folder relative to here
    with pytest.raises(UserInputError, match="cannot download it"):
        inspect_source("diffusers/tiny-sd3")
    with pytest.raises(UserInputError, match="is not a hub id"):
        inspect_source("diffusers/../diffusers/tiny-sd3")


def test_second_realisation_of_the_same_spec_loads_nothing(tiny):
    cache = PipelineCache()
    handle = PipelineHandle.of(source=tiny("flux1-schnell"), model_class="FluxPipeline")
    first, loaded_first = cache.get(handle, CPU)
    second, loaded_second = cache.get(handle, CPU)
    assert (loaded_first, loaded_second) == (True, False)
    assert first is second and cache.stats.loads == 1 and cache.stats.hits == 1


def test_another_model_replaces_the_loaded_one_and_clear_drops_all(tiny):
    cache = PipelineCache(capacity=1)
    cache.get(PipelineHandle.of(source=tiny("flux1-schnell"), model_class="FluxPipeline"), CPU)
    cache.get(PipelineHandle.of(source=tiny("sd3"), model_class="StableDiffusion3Pipeline"), CPU)
    assert len(cache) == 1 and cache.stats.loads == 2
    assert cache.clear(CPU) == 1 and len(cache) == 0


def test_loading_reports_progress_per_component_and_can_be_cancelled(tiny):
    class Cancelled(Exception):
        pass

    seen = []

    def cancel_after_two(done, total, what):
        seen.append(what)
        if done == 2:
            raise Cancelled

    cache = PipelineCache()
    with pytest.raises(Cancelled):
        cache.get(PipelineHandle.of(source=tiny("flux1-schnell"), model_class="FluxPipeline"), CPU, cancel_after_two)
    assert len(seen) == 3 and seen[0].startswith("loading ")
    assert len(cache) == 0 and cache.stats.loads == 0  # nothing half-loaded is kept


@pytest.mark.parametrize("text", ["/etc", "a/b/c", "../x/y", "owner/..", ""])
def test_a_hub_id_from_a_workflow_must_be_owner_slash_name(text):
    from tpu_diffusers_runtime.sources import check_hub_id

    with pytest.raises(UserInputError, match="is not a hub id"):
        check_hub_id(text)
