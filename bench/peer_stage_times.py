#!/usr/bin/env python3
"""Per-stage CPU timings of a peer engine, Diffusers' FluxPipeline on PyTorch, to compare kiln against.

For each size it times, with time.perf_counter under torch.inference_mode:
  encode  pipe.encode_prompt (CLIP-L + T5), best of --repeats calls;
  step    one transformer forward, called as FluxPipeline.__call__ calls it in its denoising loop
          (packed latents, img_ids/txt_ids, timestep/1000, guidance None for schnell), best of --repeats;
  decode  pipe.vae.decode of latents of that size (unpacked, scaled and shifted as the pipeline does),
          best of --repeats calls after one warm call.
It prints one JSON line per (size, stage): seconds, every call's time, the peak RSS so far, the thread
count and the torch / diffusers / transformers versions.

Model (random weights, FLUX.1-schnell widths, 2 double + 4 single blocks, 2 T5 layers):
  build/tools/kiln make-random /work/scratch/peers/model --like flux1-schnell --blocks 2+4 --t5-layers 2 --dtype bf16
Run (venv with torch diffusers transformers accelerate sentencepiece protobuf safetensors):
  nice -n 19 python bench/peer_stage_times.py /work/scratch/peers/model --dtype bfloat16 --sizes 512 1024
  nice -n 19 python bench/peer_stage_times.py /work/scratch/peers/model --dtype float32 --sizes 512 1024
"""
import argparse
import json
import resource
import time

import diffusers
import torch
import transformers
from diffusers import FluxPipeline

p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
p.add_argument("model", help="Diffusers FLUX.1 folder (model_index.json, transformer/, vae/, ...)")
p.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16", help="torch_dtype of every component")
p.add_argument("--sizes", type=int, nargs="+", default=[512, 1024], help="square image sizes in pixels")
p.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
p.add_argument("--prompt", default="a photograph of an astronaut riding a horse")
p.add_argument("--max-sequence-length", type=int, default=256, help="T5 tokens (256 as for schnell and sd.cpp)")
p.add_argument("--repeats", type=int, default=2, help="timed calls per stage (decode: after one warm call)")
p.add_argument("--stages", nargs="+", choices=["encode", "step", "decode"], default=["encode", "step", "decode"])
p.add_argument("--vae-tiling", action="store_true",
               help="tiled VAE decode with 512-px tiles (Diffusers' default tile, sample_size=1024, never tiles <= 1024)")
args = p.parse_args()

torch.set_num_threads(args.threads)
dtype = getattr(torch, args.dtype)
info = {"dtype": args.dtype, "threads": torch.get_num_threads(), "cpu": torch.backends.cpu.get_cpu_capability(),
        "torch": torch.__version__, "diffusers": diffusers.__version__, "transformers": transformers.__version__}

pipe = FluxPipeline.from_pretrained(args.model, torch_dtype=dtype)
if args.vae_tiling:
    pipe.vae.enable_tiling()
    pipe.vae.tile_sample_min_size = 512  # pixels
    pipe.vae.tile_latent_min_size = 512 // pipe.vae_scale_factor


def timed(fn, n):
    """Call fn n times; return (last result, list of seconds per call)."""
    secs = []
    for _ in range(n):
        t0 = time.perf_counter()
        out = fn()
        secs.append(time.perf_counter() - t0)
    return out, secs


def report(size, stage, secs, **extra):
    rss_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # ru_maxrss is in KiB on Linux
    print(json.dumps({"engine": "diffusers", "size": size, "stage": stage, "seconds": round(min(secs), 3),
                      "calls": [round(s, 3) for s in secs], "peak_rss_gib": round(rss_gib, 2), **extra, **info}),
          flush=True)


with torch.inference_mode():
    for size in args.sizes:
        # (a) text encoding: returns (prompt_embeds, pooled_prompt_embeds, text_ids)
        enc = lambda: pipe.encode_prompt(prompt=args.prompt, prompt_2=None, device="cpu",
                                         max_sequence_length=args.max_sequence_length)
        (prompt_embeds, pooled, txt_ids), secs = timed(enc, args.repeats if "encode" in args.stages else 1)
        if "encode" in args.stages:
            report(size, "encode", secs, t5_tokens=args.max_sequence_length)

        # (b) one denoising step, as in FluxPipeline.__call__: packed latents (1, (H/16)*(W/16), 64)
        latents, img_ids = pipe.prepare_latents(1, pipe.transformer.config.in_channels // 4, size, size,
                                                prompt_embeds.dtype, "cpu", torch.Generator().manual_seed(0))
        if "step" in args.stages:
            t = torch.full((1,), 1000.0).to(latents.dtype)  # first schnell timestep (sigma 1), t.expand(B).to(dtype)
            guidance = None  # schnell: transformer.config.guidance_embeds is False
            step = lambda: pipe.transformer(hidden_states=latents, timestep=t / 1000, guidance=guidance,
                                            pooled_projections=pooled, encoder_hidden_states=prompt_embeds,
                                            txt_ids=txt_ids, img_ids=img_ids, joint_attention_kwargs=None,
                                            return_dict=False)[0]
            _, secs = timed(step, args.repeats)
            report(size, "step", secs, image_tokens=latents.shape[1])

        # (c) VAE decode of (1, 16, H/8, W/8) latents, prepared exactly as the pipeline does
        if "decode" in args.stages:
            z = pipe._unpack_latents(latents, size, size, pipe.vae_scale_factor)
            z = (z / pipe.vae.config.scaling_factor) + pipe.vae.config.shift_factor
            dec = lambda: pipe.vae.decode(z.to(pipe.vae.dtype), return_dict=False)[0]
            _, warm = timed(dec, 1)
            _, secs = timed(dec, args.repeats)
            report(size, "decode", secs, warm_call=round(warm[0], 3), vae_tiling=args.vae_tiling)
