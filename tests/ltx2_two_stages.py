"""diffusers' documented LTX-2 two-stage recipe (docs api/pipelines/ltx2, "Two-stages Generation") in plain diffusers,
what the engine's runs with a latent upscaler are compared with (tests/test_ltx2.py, tests/e2e/test_video_server.py)."""

import torch


def two_stages(folder: str, upscaler: str, prompt: str, seed: int, videos: int, width: int, height: int,
               frames: int, steps: int, guidance: float, first_sigmas: list | None = None,
               refine_lora: tuple | None = None):
    """Stage 1 at half width and height as latents (on `first_sigmas` as given when there are, as the distilled
    checkpoint's recipe runs its first stage), the video latents upscaled x2, stage 2 on STAGE_2_DISTILLED_SIGMA_VALUES
    with a scheduler without dynamic shifting, renoised with the first sigma, at guidance 1 (with `refine_lora`, (file,
    strength), fused for the refine only: one video); one generator per video (seed + i) through both stages. Returns the frames [videos x frames, H, W, 3] in 0..1 and the waveforms
    [videos, channels, T]."""
    import diffusers
    from diffusers import FlowMatchEulerDiscreteScheduler, LTX2LatentUpsamplePipeline
    from diffusers.pipelines.ltx2.latent_upsampler import LTX2LatentUpsamplerModel
    from diffusers.pipelines.ltx2.utils import STAGE_2_DISTILLED_SIGMA_VALUES as SIGMAS

    pipe = diffusers.DiffusionPipeline.from_pretrained(folder, local_files_only=True)
    upsample = LTX2LatentUpsamplePipeline(vae=pipe.vae, latent_upsampler=LTX2LatentUpsamplerModel.from_pretrained(
        upscaler, local_files_only=True))
    first_scheduler = pipe.scheduler
    refine_scheduler = FlowMatchEulerDiscreteScheduler.from_config(pipe.scheduler.config, use_dynamic_shifting=False,
                                                                   shift_terminal=None)
    shared = dict(prompt=prompt, negative_prompt="", num_frames=frames, frame_rate=24.0, return_dict=False)
    made, waveforms = [], []
    for i in range(videos):
        generator = torch.Generator("cpu").manual_seed(seed + i)
        pipe.scheduler = refine_scheduler if first_sigmas else first_scheduler
        video_latent, audio_latent = pipe(**shared, width=width // 2, height=height // 2, num_inference_steps=steps,
                                          sigmas=first_sigmas, guidance_scale=guidance, generator=generator,
                                          output_type="latent")
        upscaled = upsample(latents=video_latent, output_type="latent", return_dict=False)[0]
        if refine_lora:
            assert videos == 1, "unfusing is not exact: one video"
            pipe.load_lora_weights(refine_lora[0], adapter_name="refine")
            pipe.set_adapters(["refine"], [refine_lora[1]])
            pipe.fuse_lora(components=["transformer"], adapter_names=["refine"])
            pipe.unload_lora_weights()
        pipe.scheduler = refine_scheduler
        video, audio = pipe(**shared, latents=upscaled, audio_latents=audio_latent, width=width, height=height,
                            num_inference_steps=3, noise_scale=SIGMAS[0], sigmas=SIGMAS, guidance_scale=1.0,
                            generator=generator, output_type="pt")
        made.append(video[0].permute(0, 2, 3, 1))
        waveforms.append(audio.float())
    return torch.cat(made), torch.cat(waveforms)
