"""TPU TP Mesh: replicas x tensor (or context) parallelism over several chips, one worker process per chip."""

from comfy_api.latest import io

from tpu_diffusers_runtime import settings
from tpu_diffusers_runtime.distributed.channel import check_attach_address
from tpu_diffusers_runtime.distributed.mesh import queued_world_size_problem
from tpu_diffusers_runtime.settings import KEY_ENV
from tpu_diffusers_runtime.specs import MeshSpec, Workers
from tpu_diffusers_runtime.errors import SettingError, UserInputError
from .types import CATEGORY, TPUPipeline

TYPED_KEY_REFUSED = (f"key must be empty: attach takes the workers' key only from ${KEY_ENV} of the ComfyUI "
                     "process, since a key typed here is saved in the workflow and travels with every copy of it. "
                     f"Clear this field, and set ${KEY_ENV} for the ComfyUI process to the key the workers printed "
                     "(then restart ComfyUI).")


class TPUMesh(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="TPUMesh",
            display_name="TPU TP Mesh",
            category=CATEGORY,
            description="One worker process per chip, arranged as replicas x TP or replicas x context parallel: "
                        "the batch is split over the replicas (image or video i keeps seed + i, so any shape gives "
                        "the same output), and each replica either shards the transformer over its TP chips (and "
                        "the text encoder where transformers has a TP plan) or splits a "
                        "video's tokens over its context-parallel chips. The ComfyUI process never loads "
                        "the full model. "
                        "Workers stay warm between prompts; Unload Models stops them.",
            inputs=[
                TPUPipeline.Input("pipeline", tooltip="The pipeline from TPU Loader, Mode Selector or Compile "
                                                      "Transformer. TP needs placement 'device'; replicas and "
                                                      "context parallelism also take model CPU offload."),
                io.Int.Input("chips", default=0, min=0, max=1024,
                             tooltip="Ranks (chips) in the whole mesh: replicas x TP, or replicas x "
                                     "context_parallel. 0 = every chip of this host (2 ranks on a CPU host, for "
                                     "trying it out)."),
                io.Boolean.Input("shard_transformer", default=True,
                                 tooltip="Shard the transformer over each replica's TP chips with diffusers' TP plan "
                                         "(where the model's transformer has one; the error names those that do). "
                                         "Off: every chip holds a whole model."),
                io.Boolean.Input("shard_text_encoder", default=True,
                                 tooltip="Shard text encoders that transformers has a TP plan for; others "
                                         "(T5, CLIP) are kept whole on every rank."),
                io.Combo.Input("workers", options=Workers, default=Workers.LAUNCH_LOCAL,
                               tooltip="launch_local: start the workers on this host with torchrun. attach: use "
                                       "workers already started with torchrun (e.g. on every host of a TPU slice)."),
                io.String.Input("address", default="",
                                tooltip="attach: host:port of rank 0's control channel, as the workers printed. "
                                        "It must be listed in $TPU_DIFFUSERS_ATTACH_ALLOW of the ComfyUI process: "
                                        "a workflow someone shares cannot send your prompts elsewhere."),
                io.String.Input("key", default="",
                                tooltip="Leave empty. attach takes the workers' key only from "
                                        "$TPU_DIFFUSERS_CONTROL_KEY of the ComfyUI process; a key typed here is "
                                        "refused, as it would be saved in the workflow file and travel with it. "
                                        "(Kept so that saved workflows keep their values.)"),
                io.Int.Input("replicas", default=0, min=0, max=1024, optional=True,
                             tooltip="Copies of the pipeline working on the batch at once; each shards over "
                                     "chips / replicas chips (TP), which must divide the attention heads. "
                                     "0 = as many as fit: one per chip when shard_transformer is off (a model "
                                     "that fits one chip: 8 chips = 8 replicas), "
                                     "one over all chips when it is on. Replicas beyond the batch stay idle. "
                                     "(Last, so workflows saved before it existed keep their values.)"),
                io.Int.Input("context_parallel", default=1, min=1, max=1024, optional=True,
                             tooltip="Chips per replica that split each video's tokens (context parallelism, "
                                     "Ulysses attention): every chip holds the whole model and runs 1/N of the "
                                     "frames' tokens, so a long video's activations are spread, for a model whose "
                                     "transformer has a CP plan (diffusers' _cp_plan). Not with TP: replicas x "
                                     "context_parallel must equal chips (replicas 0 = chips / context_parallel). "
                                     "The latent tokens (latent frames x h x w) and the attention heads must "
                                     "divide by it. 1 = off. (Added last, so older workflows keep their values.)"),
            ],
            outputs=[TPUPipeline.Output(display_name="pipeline", tooltip="The pipeline, replicated and sharded over "
                                                                         "the mesh.")],
        )

    @classmethod
    def validate_inputs(cls, workers: str | None = None, address: str | None = None,
                        key: str | None = None, chips: int | None = None) -> bool | str:
        """Checked when the prompt is queued, so attach settings that cannot work are refused on this
        node before any node runs or anything connects, and so is a chips count TorchTPU cannot launch on
        this TPU host; the run checks again. ComfyUI skips its own checks of the inputs named here, so
        workers and chips are checked here too. An input fed by a link arrives as None and is checked when
        the node runs."""
        if workers is not None and workers not in list(Workers):
            return f"workers must be '{Workers.LAUNCH_LOCAL}' or '{Workers.ATTACH}', not '{workers}'."
        if key is not None and key.strip():
            return TYPED_KEY_REFUSED
        if chips is not None and (not isinstance(chips, int) or not 0 <= chips <= 1024):
            return "chips must be a whole number from 0 to 1024 (0 = every chip of this host)."
        if workers != Workers.ATTACH:
            return queued_world_size_problem(chips or 0) or True
        if address is not None:
            try:
                check_attach_address(address.strip())
            except (UserInputError, SettingError) as e:
                return str(e)
        try:
            key_set = bool(settings.get(KEY_ENV))
        except SettingError as e:
            return str(e)
        if not key_set:
            return (f"key is empty and ${KEY_ENV} is not set: attach needs the key the workers printed. Set "
                    f"${KEY_ENV} for the ComfyUI process to it and restart ComfyUI.")
        return True

    @classmethod
    def execute(cls, pipeline, chips: int, shard_transformer: bool, shard_text_encoder: bool, workers: str,
                address: str, key: str, replicas: int = 0, context_parallel: int = 1) -> io.NodeOutput:
        if key.strip():  # fed by a link, so not seen when the prompt was queued
            raise UserInputError(TYPED_KEY_REFUSED)
        mesh = MeshSpec(chips=chips, replicas=replicas, shard_transformer=shard_transformer,
                        shard_text_encoder=shard_text_encoder, workers=workers, address=address.strip(),
                        context_parallel=context_parallel)
        return io.NodeOutput(pipeline.replace(mesh=mesh))
