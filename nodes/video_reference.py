"""TPU Video Reference: one link of a chain of references (pictures, a video with its sound, a sound clip) for a
reference to video model's TPU Video Sampler, in the order its prompt names them."""

from comfy_api.latest import io

from tpu_diffusers_runtime.errors import UserInputError
from tpu_diffusers_runtime.families import FAMILIES, REFERENCE2VIDEO, listed
from tpu_diffusers_runtime.references import AUDIO, IMAGE, VIDEO, Reference
from .types import CATEGORY, TPUReferences, link_problem

REFERENCE_FAMILIES = [family for family in FAMILIES
                      if any(REFERENCE2VIDEO in tasks for tasks in family.model_classes.values())]


def inputs_problem(image: bool, video: bool, audio: bool) -> str | None:
    """One kind of reference per node: pictures, or a video (with audio: that sound instead of its own), or a clip."""
    if not (image or video or audio):
        return "connect image, video or audio: the reference this node adds."
    if image and (video or audio):
        return ("one kind of reference per node: image with video or audio; chain another TPU Video Reference for "
                "the other.")
    return None


class TPUVideoReference(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="TPUVideoReference",
            display_name="TPU Video Reference",
            category=CATEGORY,
            description="Adds a reference for reference to video "
                        f"({listed(REFERENCE_FAMILIES) or 'no supported model yet'}) after the references connected "
                        "before it: pictures, a video with its frame rate and sound, or a sound clip. The prompt "
                        "names them in this order, numbered per kind: <Picture 1>, <Video 1>, <Audio 1>. Connect the "
                        "last node of the chain to the TPU Video Sampler's references.",
            inputs=[
                TPUReferences.Input("references", optional=True,
                                    tooltip="The references before this one (another TPU Video Reference)."),
                io.Image.Input("image", optional=True,
                               tooltip="Pictures (Load Image): each image of the batch is one reference, in batch "
                                       "order."),
                io.Video.Input("video", optional=True,
                               tooltip="A video (Load Video): its frames at its frame rate, and its sound."),
                io.Audio.Input("audio", optional=True,
                               tooltip="A sound clip (Load Audio), mono or stereo. With video: that video's sound, "
                                       "in place of its own."),
            ],
            outputs=[TPUReferences.Output(display_name="references",
                                          tooltip="Into the TPU Video Sampler's references, or the next TPU Video "
                                                  "Reference.")],
        )

    @classmethod
    def validate_inputs(cls, input_types: dict | None = None) -> bool | str:
        """Checked when the prompt is queued: link types, and one kind of reference per node."""
        connected = set(input_types or {})
        return (link_problem(cls, input_types or {})
                or inputs_problem(IMAGE in connected, VIDEO in connected, AUDIO in connected) or True)

    @classmethod
    def execute(cls, references=None, image=None, video=None, audio=None) -> io.NodeOutput:
        if problem := inputs_problem(image is not None, video is not None, audio is not None):
            raise UserInputError(problem)  # (again: a ComfyUI that passes no input_types to validate_inputs)
        if image is not None:
            added = tuple(Reference(IMAGE, frames=picture[None]) for picture in image)
        elif video is not None:
            components = video.get_components()
            sound = audio if audio is not None else components.audio
            added = (Reference(VIDEO, frames=components.images, fps=float(components.frame_rate),
                               **sound_of(sound, "the video's sound")),)
        else:
            added = (Reference(AUDIO, **sound_of(audio, "audio")),)
        for reference in added:
            if problem := reference.problem():
                raise UserInputError(problem)
        return io.NodeOutput((*(references or ()), *added))


def sound_of(audio, what: str) -> dict:
    """ComfyUI's AUDIO ({waveform [batch, channels, samples], sample_rate}) as one reference's sound; none: {}."""
    if audio is None:
        return {}
    waveform = audio["waveform"]
    if waveform.ndim != 3 or len(waveform) != 1:
        raise UserInputError(f"{what} has shape {list(waveform.shape)}: one clip per reference, [1, channels, "
                             "samples] (ComfyUI's AUDIO of one clip).")
    return {"audio": waveform[0], "sample_rate": int(audio["sample_rate"])}
