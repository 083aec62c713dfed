"""The Sampler's LATENT (runtime/outputs.py, each family's `ComfyLatent`): ComfyUI's own VAE decodes our LATENT
to our IMAGE, and a LATENT starts image to image.

The tiny pipelines get a VAE of the architecture ComfyUI builds for a VAE file (ComfyUI hard-codes the LDM VAE's
widths, 128-512 with 32 norm groups, and Wan 2.1's block structure), with random weights and non-trivial
latent statistics (FLUX.2's batch norm, Qwen-Image's mean and std), so that the conversion is what is tested.
ComfyUI (the vendored 0.3.75, --cpu) loads that VAE from the file tools/tiny_single_files.py writes in
ComfyUI's layout (ae.safetensors, flux2-vae.safetensors, qwen_image_vae.safetensors), and decodes the LATENT.
"""

import sys

import numpy as np
import pytest
import torch

import tiny_single_files as tsf
from tpu_diffusers_runtime.errors import UserInputError
from tpu_diffusers_runtime.families import family_for
from tpu_diffusers_runtime.tasks import SampleRequest, run_pipeline, task_for

SIZE = 64


def kl_vae(cls, **config):
    """An AutoencoderKL (or AutoencoderKLFlux2) the size ComfyUI's LDM VAE has."""
    torch.manual_seed(0)
    return cls(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 4,
               up_block_types=("UpDecoderBlock2D",) * 4, block_out_channels=(128, 256, 512, 512), layers_per_block=2,
               norm_num_groups=32, sample_size=SIZE, **config)


def flux2_vae():
    from diffusers import AutoencoderKLFlux2

    vae = kl_vae(AutoencoderKLFlux2, latent_channels=32, use_quant_conv=True, use_post_quant_conv=True)
    vae.bn.running_mean.normal_(0, 0.5)
    vae.bn.running_var.uniform_(0.5, 2.0)
    return vae


def qwen_vae():
    from diffusers import AutoencoderKLQwenImage

    generator = torch.Generator().manual_seed(1)
    torch.manual_seed(0)
    return AutoencoderKLQwenImage(base_dim=8, z_dim=16, dim_mult=[1, 2, 4, 4], num_res_blocks=2,
                                  temperal_downsample=[False, True, True],
                                  latents_mean=torch.randn(16, generator=generator).tolist(),
                                  latents_std=torch.rand(16, generator=generator).add(0.5).tolist())


def flux_vae(scaling_factor, shift_factor):
    from diffusers import AutoencoderKL

    return kl_vae(AutoencoderKL, latent_channels=16, scaling_factor=scaling_factor, shift_factor=shift_factor,
                  use_quant_conv=False, use_post_quant_conv=False, force_upcast=False)


def sdxl_vae():
    from diffusers import AutoencoderKL

    return kl_vae(AutoencoderKL, latent_channels=4, scaling_factor=0.13025, force_upcast=True)


# tiny model -> (its VAE the size ComfyUI builds, the VAE in ComfyUI's file layout)
VAES = {
    "flux1-schnell": (lambda: flux_vae(0.3611, 0.1159), lambda sd: tsf.vae_to_ldm(sd, 4)),
    "zimage": (lambda: flux_vae(0.3611, 0.1159), lambda sd: tsf.vae_to_ldm(sd, 4)),
    "sd3": (lambda: flux_vae(1.5305, 0.0609), lambda sd: tsf.vae_to_ldm(sd, 4)),
    "sdxl": (sdxl_vae, lambda sd: tsf.vae_to_ldm(sd, 4)),
    "flux2": (flux2_vae, lambda sd: tsf.vae_to_ldm(sd, 4)),
    "flux2-klein": (flux2_vae, lambda sd: tsf.vae_to_ldm(sd, 4)),
    "qwenimage": (qwen_vae, tsf.vae_to_wan),
    "krea2": (qwen_vae, tsf.vae_to_wan),
}
# the text-to-image and image-to-image model class of each
CLASSES = {"flux1-schnell": "FluxPipeline", "zimage": "ZImagePipeline", "sd3": "StableDiffusion3Pipeline",
           "sdxl": "StableDiffusionXLPipeline", "flux2": "Flux2Pipeline", "flux2-klein": "Flux2KleinPipeline",
           "qwenimage": "QwenImagePipeline", "krea2": "Krea2Pipeline"}


@pytest.fixture(scope="module")
def comfy():
    """ComfyUI's comfy.sd, imported as ComfyUI --cpu does."""
    from comfy_host import prepare_comfyui

    sys.path.append(str(prepare_comfyui()))
    from comfy.cli_args import args

    args.cpu = True
    import comfy.sd

    return comfy


def pipeline(tiny, name, task_class=None):
    from diffusers import DiffusionPipeline

    make_vae, _ = VAES[name]
    pipe = DiffusionPipeline.from_pretrained(tiny(name), vae=make_vae(), torch_dtype=torch.float32)
    return pipe if task_class is None else task_class.from_pipe(pipe)


def request(**fields):
    return SampleRequest(**{"prompt": "a photo of a cat", "width": SIZE, "height": SIZE, "steps": 2,
                            "guidance": 1.0, "seed": 3, **fields})


def eight_bit(images) -> np.ndarray:
    return (np.clip(np.asarray(images, dtype=np.float32), 0, 1) * 255).round()


@pytest.mark.parametrize("name", list(VAES))
def test_comfyuis_vae_decode_of_our_latent_is_our_image(comfy, tiny, name):
    pipe = pipeline(tiny, name)
    family = family_for(CLASSES[name])
    made = run_pipeline(pipe, family, request(batch_size=2))
    samples = made.latent["samples"]
    assert samples.dtype == torch.float32 and samples.device.type == "cpu"
    assert tuple(samples.shape) == family.comfy_latent.shape(2, SIZE, SIZE)

    _, comfy_layout = VAES[name]
    vae = comfy.sd.VAE(sd=comfy_layout(pipe.vae.state_dict()))
    assert vae.latent_channels == family.comfy_latent.channels  # ComfyUI read the file as this family's VAE
    with torch.no_grad():  # as ComfyUI runs its nodes
        decoded = vae.decode(samples)
    decoded = decoded.reshape(-1, *decoded.shape[-3:])  # as ComfyUI's VAEDecode combines a video VAE's frames
    difference = np.abs(eight_bit(decoded) - eight_bit(made.images))
    assert difference.max() <= 1, f"{name}: {difference.max()} levels apart"
    assert np.std(eight_bit(made.images)) > 1  # not a blank image, where any latent would pass


# families whose image-to-image pipeline starts from a LATENT
IMAGE2IMAGE = {"flux1-schnell": "FluxImg2ImgPipeline", "qwenimage": "QwenImageImg2ImgPipeline",
               "sdxl": "StableDiffusionXLImg2ImgPipeline", "sd3": "StableDiffusion3Img2ImgPipeline",
               "zimage": "ZImageImg2ImgPipeline"}


@pytest.mark.parametrize("name", list(IMAGE2IMAGE))
def test_latent_in_starts_image_to_image_from_those_latents(tiny, name):
    """Image to image from our own LATENT is what diffusers' image-to-image pipeline gives when its `image` is
    those latents as it samples them (so the conversion back is the inverse), and it is deterministic."""
    import diffusers

    pipe = pipeline(tiny, name)
    family = family_for(CLASSES[name])
    latent = run_pipeline(pipe, family, request(batch_size=2)).latent["samples"]

    image2image = getattr(diffusers, IMAGE2IMAGE[name]).from_pipe(pipe)
    second = request(latent=latent, denoise=0.6, seed=7, batch_size=3, steps=4)
    task, task_pipeline = task_for(family, CLASSES[name], second)
    assert task_pipeline.cls == IMAGE2IMAGE[name]
    ours = task.run(image2image, family, task_pipeline, second)
    assert torch.equal(ours.images, task.run(image2image, family, task_pipeline, second).images)
    assert ours.images.shape == (3, SIZE, SIZE, 3)

    start = family.comfy_latent.to_pipeline(image2image, latent[1:2])  # output image 1 starts from latent 1 (of 2)
    plain = image2image(prompt="a photo of a cat", image=start, width=SIZE, height=SIZE, num_inference_steps=4,
                        strength=0.6, generator=torch.Generator().manual_seed(8), output_type="pt",
                        **{family.guidance_kwarg: 1.0},
                        **({"negative_prompt": " "} if family.takes_negative_prompt else {})).images
    assert torch.allclose(ours.images[1], plain[0].permute(1, 2, 0).clamp(0, 1), atol=1e-5)


def test_size_zero_is_the_latents_size():
    from tpu_diffusers_runtime.tasks import prepare

    for model_class, latent in (("FluxPipeline", torch.zeros(1, 16, 6, 4)),
                                ("QwenImagePipeline", torch.zeros(2, 16, 1, 6, 4))):
        *_, resolved = prepare(model_class, request(latent=latent, width=0, height=0, denoise=0.5))
        assert (resolved.width, resolved.height) == (32, 48), model_class


def test_latent_in_refusals():
    """Checked before anything loads (tasks.prepare), each saying what to change."""
    from tpu_diffusers_runtime.tasks import prepare

    latent = torch.zeros(1, 16, SIZE // 8, SIZE // 8)
    image = np.zeros((1, SIZE, SIZE, 3), dtype=np.float32)
    with pytest.raises(UserInputError, match="both an image and a latent"):
        prepare("FluxPipeline", request(latent=latent, images=(image,), denoise=0.5))
    with pytest.raises(UserInputError, match="a mask and a latent"):
        prepare("FluxPipeline", request(latent=latent, mask=image[..., 0], denoise=0.5))
    with pytest.raises(UserInputError, match=r"has shape \[1, 4, 8, 8\].*takes \[1, 16, 8, 8\]"):
        prepare("FluxPipeline", request(latent=torch.zeros(1, 4, 8, 8), denoise=0.5))
    with pytest.raises(UserInputError, match=r"has shape \[1, 16, 8, 8\].*takes \[1, 16, 1, 8, 8\]"):
        prepare("QwenImagePipeline", request(latent=latent, denoise=0.5))  # Qwen-Image's LATENT is 5-D
    with pytest.raises(UserInputError, match=r"at 128x128 takes \[1, 16, 16, 16\]"):  # another size than asked
        prepare("FluxPipeline", request(latent=latent, width=128, height=128, denoise=0.5))
    with pytest.raises(UserInputError, match="has no image2image pipeline, and a latent is connected"):
        prepare("Flux2Pipeline", request(latent=torch.zeros(1, 128, 4, 4), denoise=0.5))
    with pytest.raises(UserInputError, match="has no image2image pipeline, and a latent is connected"):
        prepare("QwenImageEditPipeline", request(latent=latent, denoise=0.5))  # never an edit's reference


def test_a_latent_travels_to_workers_with_the_images_and_mask():
    image, mask = np.random.default_rng(0).random((2, 1, 8, 8, 3), dtype=np.float32)
    latent = torch.randn(2, 16, 1, 6, 4)
    sent = request(latent=latent, images=(image,), mask=mask[..., 0])
    data, payloads = sent.to_wire()
    received = SampleRequest.from_wire(data, [bytes(payload) for payload in payloads])
    assert np.array_equal(received.latent, latent.numpy()) and np.array_equal(received.mask, sent.mask)
    assert np.array_equal(received.images[0], image) and received == sent
    assert SampleRequest.from_wire(*request().to_wire()).latent is None


def test_qwen_image_21s_latent_decodes_with_its_vae_to_the_image_and_alpha(tiny):
    """Qwen-Image 2.1's LATENT is in ComfyUI's QwenImage21 format (64 channels, 4-D, raw: the sampled latents x std +
    mean). The vendored ComfyUI 0.3.75 has no Qwen-Image 2.1 VAE to decode it, so diffusers' own VAE does, as
    QwenImage21Pipeline decodes (the frame axis added back): it gives the images and their MASK (1 - alpha)."""
    from diffusers import QwenImage21Pipeline

    pipe = QwenImage21Pipeline.from_pretrained(tiny("qwenimage21"), torch_dtype=torch.float32)
    generator = torch.Generator().manual_seed(1)
    channels = pipe.vae.config.z_dim
    pipe.vae.register_to_config(latents_mean=torch.randn(channels, generator=generator).tolist(),
                                latents_std=torch.rand(channels, generator=generator).add(0.5).tolist())
    family = family_for("QwenImage21Pipeline")
    made = run_pipeline(pipe, family, request(batch_size=2))
    samples = made.latent["samples"]
    assert tuple(samples.shape) == family.comfy_latent.shape(2, SIZE, SIZE) == (2, 64, SIZE // 16, SIZE // 16)
    with torch.no_grad():
        decoded = pipe.image_processor.postprocess(pipe.vae.decode(samples[:, :, None]).sample[:, :, 0],
                                                   output_type="pt")
    rgba = torch.cat([made.images, 1 - made.mask[..., None]], dim=-1)
    difference = np.abs(eight_bit(decoded.permute(0, 2, 3, 1)) - eight_bit(rgba))
    assert difference.max() <= 1, f"{difference.max()} levels apart"
    assert np.std(eight_bit(made.images)) > 1 and np.std(eight_bit(made.mask)) > 1


def test_flux3_klein_latent_is_flux2s_and_comfyuis_vae_decodes_it_to_the_image(comfy, tiny):
    """FLUX 3 [klein] (a modular pipeline) samples in FLUX.2's latent space with FLUX.2's VAE: its LATENT is ComfyUI's
    Flux2 LATENT, which ComfyUI's VAE of flux2-vae.safetensors decodes to the image."""
    from tpu_diffusers_runtime.device import device_info
    from tpu_diffusers_runtime.handle import PipelineHandle
    from tpu_diffusers_runtime.loading import load_pipeline

    pipe = load_pipeline(PipelineHandle.of(source=tiny("flux3"), model_class="Flux3ModularPipeline"),
                         device_info("cpu"))
    pipe.update_components(vae=flux2_vae())
    family = family_for("Flux3ModularPipeline")
    made = run_pipeline(pipe, family, request(batch_size=2))
    samples = made.latent["samples"]
    assert tuple(samples.shape) == family.comfy_latent.shape(2, SIZE, SIZE) == (2, 128, SIZE // 16, SIZE // 16)
    vae = comfy.sd.VAE(sd=tsf.vae_to_ldm(pipe.vae.state_dict(), 4))
    with torch.no_grad():
        decoded = vae.decode(samples)
    difference = np.abs(eight_bit(decoded) - eight_bit(made.images))
    assert difference.max() <= 1, f"{difference.max()} levels apart"
    assert np.std(eight_bit(made.images)) > 1
