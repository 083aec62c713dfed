"""Pipeline kinds: how a loaded model's components become the pipeline that runs a task, and how it is called.

- **classic**: a diffusers `DiffusionPipeline` class per model class, built from the loaded components; each task's
  class is made from it with `from_pipe` (no reload: the same modules).
- **modular**: diffusers `ModularPipeline` blocks (`diffusers.modular_pipelines`) that the family names per model
  class (`Family.modular`). The same components, loaded once from the same diffusers folder by the same loader
  (single files, TP sharding, CP and dtype alike), are registered into a pipeline of the blocks; each task runs
  one workflow of the blocks (`get_workflow`) on those same modules, called with the same inputs.

A family with only modular blocks runs modular; a family with both runs classic unless TPU_DIFFUSERS_PIPELINE_KIND
asks modular. Both kinds give the rest of the house the same pipeline object: its components as attributes
(`transformer`, `vae`, ...) and in `components`, so the cache, compile, LoRA and TP/CP treat them alike.

Model CPU offload hooks a modular pipeline's models as diffusers hooks a classic pipeline's (features/offload.py).
What the modular kind does not do yet, refused with a UserInputError: tasks the family's blocks have no workflow
for, and call inputs the blocks do not take.
"""

from __future__ import annotations

import copy
import inspect
import types

from . import settings
from .errors import ModelLoadError, UserInputError
from .families import FAMILIES, Family
from .families.base import ModularBlocks
from .sources import config_values
from .specs import Placement

CLASSIC = "classic"
MODULAR = "modular"
STEP_INPUT = "tpu_diffusers_on_step"  # the modular call input that carries the step callback into the denoising loop
# the tasks' outputs-per-call inputs (Task.count_kwarg): left out at 1 for blocks that take none (one per call)
COUNT_INPUTS = ("num_images_per_prompt", "num_videos_per_prompt")


def kind_for(family: Family, model_class: str) -> "ClassicKind | ModularKind":
    """The kind a model of `model_class` loads and runs as: modular when the family has only modular blocks for it,
    or has both and TPU_DIFFUSERS_PIPELINE_KIND asks modular; else classic."""
    blocks = family.modular.get(model_class)
    if blocks is None:
        return CLASSIC_KIND
    # a model class whose tasks name no class, or the blocks' own ModularPipeline class, has no classic pipeline
    has_classic = any(task.cls not in ("", blocks.pipeline) for task in family.model_classes[model_class].values())
    if not has_classic or settings.get("TPU_DIFFUSERS_PIPELINE_KIND") == MODULAR:
        return ModularKind(family, blocks)
    return CLASSIC_KIND


def takes_negative_prompt(pipe, family: Family) -> bool:
    """Whether a run of `pipe` uses the Sampler's negative prompt: the family's pipelines take one, and these are not
    distilled modular blocks that take none (ModularBlocks.unguided)."""
    return family.takes_negative_prompt and not (is_modular(pipe) and modular_kind_of(pipe).blocks.unguided)


def takes_guidance(pipe) -> bool:
    """Whether a run of `pipe` uses the Sampler's guidance: not for distilled modular blocks that take none
    (ModularBlocks.unguided)."""
    return not (is_modular(pipe) and modular_kind_of(pipe).blocks.unguided)


def upsamples_prompt(pipe) -> bool:
    """Whether `pipe` first rewrites the prompt with its blocks' prompt upsampler (ModularBlocks.prompt_upsampler)."""
    if not is_modular(pipe):
        return False
    upsampler = modular_kind_of(pipe).blocks.prompt_upsampler
    return bool(upsampler) and upsampler in pipe.blocks.sub_blocks


def is_modular(pipe) -> bool:
    from diffusers.modular_pipelines import ModularPipeline

    return isinstance(pipe, ModularPipeline)


def call(pipe, family: Family, kwargs: dict, on_step):
    """Run one call of a task on `pipe` (either kind); on_step(step, steps, latents) after each denoising step, with
    the loop's latents as classic pipelines' callback_on_step_end gets them (it may raise to cancel). Returns diffusers'
    output (`.images`, or a video task's `.frames`)."""
    if is_modular(pipe):
        return ModularKind.call(pipe, family, kwargs, on_step)
    return ClassicKind.call(pipe, kwargs, on_step)


class ClassicKind:
    name = CLASSIC

    @staticmethod
    def takes(model_class: str, workflow: str = "") -> set[str]:
        """The components the pipeline class takes (a classic pipeline has no workflows)."""
        import diffusers

        return set(inspect.signature(getattr(diffusers, model_class)).parameters)

    @staticmethod
    def partition_note(model_class: str, workflow: str) -> str:
        return ""  # it loads every component it takes

    @staticmethod
    def assemble(model_class: str, loaded: dict, index: dict, source: str):
        import diffusers

        pipeline_cls = getattr(diffusers, model_class)
        try:
            return pipeline_cls(**loaded, **init_options(pipeline_cls, index))
        except TypeError as e:  # a component the pipeline needs is not in model_index.json
            raise ModelLoadError(f"'{source}' cannot make a {model_class} ({e}); download the model again.") from e

    @staticmethod
    def call(pipe, kwargs: dict, on_step):
        def step_end(running, step, _timestep, callback_kwargs):
            # the pipeline's own count of the timesteps it runs (with denoise < 1 it skips the first ones by its rule)
            on_step(step, running.num_timesteps, callback_kwargs["latents"])
            return callback_kwargs

        return pipe(**kwargs, callback_on_step_end=step_end)


CLASSIC_KIND = ClassicKind()


def init_options(pipeline_cls, index: dict | None = None) -> dict:
    """The pipeline's settings beside its components: what model_index.json records for its __init__ (e.g.
    force_zeros_for_empty_prompt, is_distilled, as from_pretrained passes them), and no invisible watermark (a
    pipeline that takes `add_watermarker` adds one whenever the invisible-watermark package is installed; ComfyUI
    never watermarks)."""
    takes = inspect.signature(pipeline_cls).parameters
    options = {name: value for name, value in config_values(index or {}).items() if name in takes}
    if "add_watermarker" in takes:
        options["add_watermarker"] = False
    return options


class ModularKind:
    name = MODULAR

    def __init__(self, family: Family, blocks: ModularBlocks):
        self.family, self.blocks = family, blocks

    def _blocks(self):
        """A fresh copy of the family's blocks whose denoising loops report each step (diffusers' blocks share
        sub-block instances between copies made from the class, so they are copied before a block is added)."""
        import diffusers

        blocks = copy.deepcopy(getattr(diffusers, self.blocks.blocks)())
        _observe_steps(blocks)
        return blocks

    def takes(self, model_class: str, workflow: str = "") -> set[str]:
        """The components the blocks load from the folder (diffusers creates the rest, e.g. guiders, from config): those
        of `workflow`'s partition where the family names partitions (ModularBlocks.partitions: a component only
        another partition uses does not load), else every one of the blocks'."""
        blocks = self._blocks()
        parts = [blocks.get_workflow(name) for name in self.blocks.partition(workflow)] or [blocks]
        return {spec.name for part in parts for spec in part.expected_components
                if spec.default_creation_method == "from_pretrained"}

    def partition_note(self, model_class: str, workflow: str) -> str:
        """For the run's info, where the blocks have partitions: which one loaded and what it left out (a switch to
        another partition's workflow loads that one in place of this one)."""
        if not self.blocks.partitions:
            return ""
        loaded = self.blocks.partition(workflow)
        mine = self.takes(model_class, workflow)
        others = [group for group in self.blocks.partitions if group != loaded]
        theirs = set().union(*(self.takes(model_class, group[0]) for group in others))
        return (f"loaded {'/'.join(loaded)}'s own {', '.join(sorted(mine - theirs))}; "
                f"{', '.join(sorted(theirs - mine))} of {'/'.join(w for group in others for w in group)} not loaded")

    def assemble(self, model_class: str, loaded: dict, index: dict, source: str):
        """A pipeline of the blocks holding the loaded components, with model_index.json's settings beside them in its
        config (as a classic pipeline has them: the family's setting changes read them there)."""
        return _pipeline(self.blocks, self._blocks(), config_values(index),
                         {name: module for name, module in loaded.items() if module is not None})

    def task_pipeline(self, base, task: str, made: dict, upsample_prompt: bool = True):
        """The pipeline that runs `task`: the task's workflow of the blocks on `base`'s components, made once per
        task (nothing loads: the same modules, so a compiled denoiser stays compiled and fused LoRAs stay fused),
        with the blocks' prompt upsampler first where they have one and `upsample_prompt` asks for it."""
        workflow = self.blocks.workflows.get(task)
        if workflow is None:
            raise UserInputError(
                f"{self.family.name}'s modular pipeline ({self.blocks.blocks}) has no workflow for {task}; it runs "
                f"{', '.join(self.blocks.workflows)}. Use another task, or TPU_DIFFUSERS_PIPELINE_KIND=classic for a "
                "family that has a classic pipeline.")
        upsampler = self.blocks.prompt_upsampler if upsample_prompt else ""
        if upsampler and getattr(base, upsampler, None) is None:
            raise UserInputError(
                f"prompt_upsampling is on, but this {self.family.name} model has no prompt upsampler: its folder (or "
                f"the File Loader's configs folder) has no '{upsampler}' folder with weights. Turn prompt_upsampling "
                f"off to encode the prompt as written, or put the upsampler's diffusers folder there as "
                f"'{upsampler}'.")
        key = (task, bool(upsampler))
        if key not in made:
            components = {name: getattr(base, name) for name in base.pretrained_component_names
                          if getattr(base, name, None) is not None}
            model_settings = {name: value for name, value in base.config.items()
                              if not name.startswith("_") and name not in base.component_names}
            blocks = base.blocks.get_workflow(workflow)  # a new sequence of the blocks' steps: one may be left out
            if self.blocks.prompt_upsampler and not upsampler:
                blocks.sub_blocks.pop(self.blocks.prompt_upsampler)
            made[key] = _pipeline(self.blocks, blocks, model_settings, components)
        return made[key]

    @staticmethod
    def call(pipe, family: Family, kwargs: dict, on_step):
        kwargs = dict(kwargs)
        blocks = modular_kind_of(pipe).blocks
        if blocks.unguided:  # distilled blocks that take no guidance (the classic pipeline runs them without CFG)
            kwargs.pop(family.guidance_kwarg)
            kwargs.pop("negative_prompt", None)
        elif blocks.guider is not None:  # these blocks guide through their guider component, not a call input
            pipe.update_components(guider=pipe.guider.new(**blocks.guider(kwargs.pop(family.guidance_kwarg))))
        takes = set(pipe.default_call_parameters)
        for count in COUNT_INPUTS:  # one output per call is what blocks without a count input make
            if kwargs.get(count) == 1 and count not in takes:
                kwargs.pop(count)
        unknown = sorted(set(kwargs) - takes)
        if unknown:
            raise UserInputError(f"{family.name}'s modular pipeline ({type(pipe).__name__}) takes no "
                                 f"{', '.join(unknown)}; set TPU_DIFFUSERS_PIPELINE_KIND=classic for this run.")
        if not blocks.outputs:
            return pipe(**kwargs, **{STEP_INPUT: on_step})
        # blocks whose outputs have other names than the pack reads (`videos` for `frames`): those outputs, renamed
        made = pipe(**kwargs, **{STEP_INPUT: on_step}, output=list(blocks.outputs.values()))
        return types.SimpleNamespace(**{ours: made[theirs] for ours, theirs in blocks.outputs.items()})


def _pipeline(blocks: ModularBlocks, pipeline_blocks, model_settings: dict, components: dict):
    """A modular pipeline of `pipeline_blocks` with these components, and these model settings in its config (the
    blocks' own config values among them, e.g. force_zeros_for_empty_prompt, take them as from_pretrained
    would)."""
    import diffusers

    pipe = getattr(diffusers, blocks.pipeline)(blocks=pipeline_blocks, config_dict=model_settings)
    pipe.update_components(**components)
    pipe.register_to_config(**model_settings)
    return pipe


def modular_kind_of(pipe) -> "ModularKind":
    """The kind that made the modular pipeline `pipe`: each family's blocks run in a ModularPipeline class of their
    own, which tells them apart."""
    return next(ModularKind(family, blocks) for family in FAMILIES
                for blocks in family.every_modular if blocks.pipeline == type(pipe).__name__)


def _observe_steps(blocks) -> None:
    """Add a step reporter as the last block of every denoising loop in `blocks`: it runs after the loop's scheduler
    step, with the loop's index, timesteps and updated latents, and calls the run's STEP_INPUT (an exception raised
    there, ComfyUI's Cancel, ends the run as a classic pipeline's callback_on_step_end does)."""
    from diffusers.modular_pipelines import LoopSequentialPipelineBlocks

    if isinstance(blocks, LoopSequentialPipelineBlocks):
        blocks.sub_blocks["report_step"] = _step_reporter()
        return
    for block in blocks.sub_blocks.values():
        _observe_steps(block)


def _step_reporter():
    from diffusers.modular_pipelines import ModularPipelineBlocks
    from diffusers.modular_pipelines.modular_pipeline_utils import InputParam

    class ReportStep(ModularPipelineBlocks):
        @property
        def description(self) -> str:
            return "Reports each denoising step to the run's callback (TPU Diffusers' progress and Cancel)."

        @property
        def inputs(self) -> list:
            return [InputParam(STEP_INPUT, description="on_step(step, steps, latents), called after each step")]

        def __call__(self, components, block_state, i: int, t):
            on_step = getattr(block_state, STEP_INPUT, None)
            if on_step is not None:
                on_step(i, len(block_state.timesteps), block_state.latents)
            return components, block_state

    return ReportStep()
