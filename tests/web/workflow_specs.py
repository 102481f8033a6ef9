"""The shipped workflows, described once, and built into UI-format JSON by the real front end.

``python tests/web/build_workflows.py`` starts a throwaway ComfyUI server with the pack, opens the
front end in headless Chromium, creates each graph below with LiteGraph (nodes, widget values by
name, links by slot name), and saves ``app.graph.serialize()`` - exactly what ComfyUI's Save writes
- to ``example_workflows/<name>.json``. The tests read the JSON files; this module also tells them which
model file names the loaders use, so placeholder files can be created for combo validation.
"""

from __future__ import annotations

from support.workflow_api import JENSEN_TAYLOR, QUANT_INT2

# ------------------------------------------------------------------------------------------ models
VAE = "wan_2.1_vae.safetensors"
TEXT_ENCODER = "umt5_xxl_fp8_e4m3fn_scaled.safetensors"
# the Wan checkpoints as their authors publish them, read by Load AR Video Checkpoint (no conversion step)
SELF_FORCING = "self_forcing_dmd.pt"  # gdhe17/Self-Forcing checkpoints/self_forcing_dmd.pt
CAUSVID = (
    "causvid_autoregressive_3step.pt"  # tianweiy/CausVid autoregressive_checkpoint/model.pt, saved under this name
)
SKYREELS_DF = "Wan2_1-SkyReels-V2-DF-1_3B-540P_fp32.safetensors"
LONGLIVE = "longlive_base.pt"  # LongLive 1.0's base (Efficient-Large-Model/LongLive-1.3B models/longlive_base.pt)
LONGLIVE_LORA = "longlive_lora.pt"  # its LoRA (models/lora.pt), saved under this name beside the base, merged at load
KREA = "krea-realtime-video-14b.safetensors"  # Krea Realtime 14B's single file, its model. prefix stripped at load
CAUSAL_FORCING = "causal_forcing-framewise-2step.pt"  # Causal Forcing++ causal-forcing++/framewise-2step.pt
NO_LORA = "none"
TINY_AR = "jensen-kv-tiny-ar.safetensors"  # bundled with the pack (models/tiny_ar), listed by Load Diffusion Model
CLIP_IN = "jensen_kv_clip_to_extend.mp4"  # the video the extend workflows start from (ComfyUI/input)
STORY_CACHE = "output/jensen_kv/story_kv_cache_00001_.safetensors"  # written by the story workflow's Save KV Cache
#: how Load KV Cache lists that file (no extension: the front end would take it for a missing model)
STORY_CACHE_NAME = STORY_CACHE[: -len(".safetensors")]

# Sand AI's 4.5B distill shards as published (ckpt/magi/4.5B_distill/inference_weight.distill/model-0000k-of-00002),
# saved side by side under these names: Load MAGI-1 Model lists the set as its first shard and reads both
MAGI1_DISTILL = "magi1_4.5b_distill-00001-of-00002.safetensors"
MAGI1_DISTILL_2 = "magi1_4.5b_distill-00002-of-00002.safetensors"
MAGI1_VAE = "magi1_vae.safetensors"  # Sand AI's ckpt/vae/diffusion_pytorch_model.safetensors (Load MAGI-1 VAE)
T5_XXL = "t5xxl_fp16.safetensors"  # T5 v1.1 XXL, loaded with CLIPLoader type pixart (MAGI-1 Text Encode)

# folder (under ComfyUI/models) -> files the workflows name
MODEL_FILES: dict[str, tuple[str, ...]] = {
    "diffusion_models": (
        SELF_FORCING,
        CAUSVID,
        SKYREELS_DF,
        LONGLIVE,
        LONGLIVE_LORA,
        KREA,
        CAUSAL_FORCING,
        MAGI1_DISTILL,
        MAGI1_DISTILL_2,
    ),
    "text_encoders": (TEXT_ENCODER, T5_XXL),
    "vae": (VAE, MAGI1_VAE),
}
#: shipped with the pack, not downloaded: the Note says where it is
BUNDLED_MODELS: dict[str, tuple[str, ...]] = {"diffusion_models": (TINY_AR,)}


def write_placeholder_files(base) -> None:
    """What the workflows' file widgets name, so the combos list them: model files, the clip, a KV cache."""
    from pathlib import Path

    from safetensors.torch import save_file
    from support.browser import write_placeholder_models

    base = Path(base)
    write_placeholder_models(base, MODEL_FILES)
    write_published_checkpoints(base / "models" / "diffusion_models")
    (base / "input").mkdir(parents=True, exist_ok=True)
    (base / "input" / CLIP_IN).touch()
    cache = base / STORY_CACHE
    cache.parent.mkdir(parents=True, exist_ok=True)
    import torch

    save_file({"placeholder": torch.zeros(1)}, str(cache), metadata={"format": "jensen_kv_run_state"})


#: each published checkpoint's layout (what write_published_checkpoints writes): the entries and their key prefix
PUBLISHED_LAYOUTS: dict[str, dict[str, str]] = {
    SELF_FORCING: {"generator": "model._fsdp_wrapped_module.", "generator_ema": "model."},
    CAUSAL_FORCING: {"generator": "model.", "generator_ema": "model."},
    CAUSVID: {"generator": "model._fsdp_wrapped_module."},
    LONGLIVE: {"generator": "model."},
}


def write_published_checkpoints(folder, dim: int = 128, ffn_dim: int = 256, layers: int = 1) -> None:
    """Tiny Wan 2.1 T2V checkpoints in their authors' published layouts under the workflows' names: the .pt training
    checkpoints (entries and key prefixes as :data:`PUBLISHED_LAYOUTS`), LongLive's PEFT LoRA and Krea's prefixed
    safetensors, random weights of the smallest shapes ComfyUI detects as wan2.1 (dim 128, 4096-wide text):
    files Load AR Video Checkpoint really loads. Pure torch (the converter's own list of shapes)."""
    from pathlib import Path

    import torch
    from safetensors.torch import save_file
    from support.pack import load_pack_module

    wan_t2v_shapes = load_pack_module("runtime.families.wan.model.checkpoint").wan_t2v_shapes

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(0)
    shapes = wan_t2v_shapes(dim, ffn_dim, layers)

    def weights():
        return {k: torch.randn(s, generator=g) * 0.02 for k, s in shapes.items()}

    for name, layout in PUBLISHED_LAYOUTS.items():
        state = {}
        for entry, prefix in layout.items():
            state[entry] = {prefix + k: v for k, v in weights().items()}
        torch.save(state, folder / name)
    lora = {}
    for k, s in shapes.items():
        if k.startswith("blocks.") and len(s) == 2:
            module = k.removesuffix(".weight")
            lora[f"base_model.model.{module}.lora_A.weight"] = torch.randn(2, s[1], generator=g) * 0.02
            lora[f"base_model.model.{module}.lora_B.weight"] = torch.randn(s[0], 2, generator=g) * 0.02
    torch.save({"generator_lora": lora}, folder / LONGLIVE_LORA)
    save_file({f"model.{k}": v.bfloat16() for k, v in weights().items()}, str(folder / KREA))


_COMMON_FILES = f"""Model files (put them under ComfyUI/models/, then press R to refresh the loaders):
- models/text_encoders/{TEXT_ENCODER}
  from Comfy-Org/Wan_2.1_ComfyUI_repackaged (split_files/text_encoders); load it with CLIPLoader type "wan".
- models/vae/{VAE}
  from Comfy-Org/Wan_2.1_ComfyUI_repackaged (split_files/vae)."""

_SELF_FORCING_FILE = f"""- models/diffusion_models/{SELF_FORCING}
  Self-Forcing (Wan 2.1 T2V 1.3B, chunk-wise causal): gdhe17/Self-Forcing's checkpoints/self_forcing_dmd.pt.
  Load AR Video Checkpoint reads it as published, its EMA weights (weights auto): no conversion step.
  (tools/convert_checkpoint.py stays the way to make a smaller BF16 file for Load Diffusion Model once.)"""

_CAUSVID_FILE = f"""- models/diffusion_models/{CAUSVID}
  CausVid (tianweiy/CausVid, autoregressive_checkpoint/model.pt, the released 3-step model), published under
  that generic name: saved under this one, Load AR Video Checkpoint reads it as it is (its generator entry).
  (tools/convert_checkpoint.py stays the way to make a smaller BF16 file for Load Diffusion Model once.)"""

_SKYREELS_FILE = f"""- models/diffusion_models/{SKYREELS_DF}
  from Kijai/WanVideo_comfy (Skyreels/ folder), or Skywork/SkyReels-V2-DF-1.3B-540P converted to one
  .safetensors; ComfyUI detects it as wan2.1. ComfyUI drops DF-1.3B's fps embedding when it loads it
  (the log says "unet unexpected: ... fps_embedding ..."). The reference adds that embedding to every
  block's modulation (transformer.py:685-692), so this model's output differs from the reference's."""

_PLANNER_TIP = """Before you press Run: the Quantize KV Cache node shows the effective bits and, under
"Memory planner", the projected peak cache size at BF16 and at the chosen setting (it follows this
workflow's latent size, chunk, window, sink and cfg; pick the model preset or type layers/heads/head_dim).
After the run the sampler shows what the cache really cost and the seconds per chunk."""

_SCHEDULE_SF = """Schedule: AR Video Schedule, preset self_forcing_4step: Self-Forcing's denoising steps
[1000, 750, 500, 250] warped with shift 5, i.e. the model sees t = 1000, 937.5, 833.3, 625 (sigma =
t / 1000; the last step goes to 0). LCM sampler: predict x0, then re-noise with fresh noise, as
Self-Forcing does; every chunk and every step draws its own noise from the seed."""

_SKYREELS_MODE = """EXPERIMENTAL: this is an experimental causal variant of SkyReels-V2 DF, not the reference's
documented mode. SkyReels' documented runs (generate_video_df.py without --causal_attention) attend
bidirectionally, keep no KV cache and re-encode overlap_history frames for long videos. This
workflow runs block-causal attention with causal_block_size = chunk_frames, every chunk fully
denoised before the next (ar_step >= steps, addnoise_condition 0), through a KV cache of the
finished chunks: the only DF mode in which such a cache exists, and the one the KV-cache results
need; the asynchronous mode (several chunks at different noise levels at once) is not supported. Units: the sampler's context_noise is a sigma (0..1); the reference's
addnoise_condition is a timestep t (0..1000): addnoise_condition 20 = context_noise 0.02.
Sampling: KSamplerSelect uni_pc_bh2 (closest to the reference's FlowUniPC, bh2; ComfyUI's runs
order 3, the reference order 2) with BasicScheduler simple, 30 steps, on ModelSamplingSD3 shift 8:
its last non-zero sigma is 0.2197 against the reference's 0.216 (AR Video Schedule's skyreels_v2_df
preset gives the reference's sigmas exactly). Do not use the KSampler-style sampler node here: it
drops the penultimate sigma for UniPC (last non-zero sigma 0.357)."""

NOTE_SELF_FORCING = f"""Self-Forcing text-to-video with a 2-bit KV cache + Jensen bias correction

Wan 2.1 T2V 1.3B, chunk-wise autoregressive: 832x480, 81 frames = 21 latent frames, generated
3 latent frames per chunk (7 chunks), cfg 1 (one CFG branch cached).
{_SCHEDULE_SF}
The KV cache of finished chunks is stored in INT2 (group 32, FP8 scales: 2.75 bits/element,
5.8x smaller than BF16) and the Jensen bias correction removes the attention shift that
quantized keys cause. CausVid has its own schedule: use the CausVid workflow.

{_COMMON_FILES}
{_SELF_FORCING_FILE}

{_PLANNER_TIP}"""

NOTE_CAUSVID = f"""CausVid text-to-video (the released 3-step checkpoint) with INT2 + Jensen

CausVid's schedule is not Self-Forcing's: the released autoregressive checkpoint was distilled for
t = 1000, 757, 522 without warp (AR Video Schedule, preset causvid_3step). Its warp-4step config
uses shift 8 instead (t = 1000, 960, 888.9, 727.3: preset causvid_warp_4step) - pick the preset
that matches the checkpoint you converted. 832x480, 81 frames, 3 latent frames per chunk, LCM
(predict x0, re-noise with fresh noise), cfg 1.

{_COMMON_FILES}
{_CAUSVID_FILE}

{_PLANNER_TIP}"""

_LONGLIVE_FILE = f"""- models/diffusion_models/{LONGLIVE} and models/diffusion_models/{LONGLIVE_LORA}
  LongLive 1.0 (Wan 2.1 T2V 1.3B, chunk-wise causal): Efficient-Large-Model/LongLive-1.3B ships
  models/longlive_base.pt (the base generator) and models/lora.pt (a rank-256 LoRA), published under that
  generic name: saved as {LONGLIVE_LORA} beside the base, it loads. Load AR Video Checkpoint merges the LoRA
  into the base's generator entry at load (lora_name), as LongLive's inference does: no conversion step.
  (tools/convert_checkpoint.py longlive_base.pt longlive.safetensors --lora lora.pt makes one merged BF16
  file for Load Diffusion Model once.)"""

#: LongLive's configs/longlive_inference.yaml: local_attn_size 12, sink_size 3 (latent frames), 3 per block
LONGLIVE_WINDOW = {"chunk_frames": 3, "window_chunks": 2, "sink_chunks": 1}

NOTE_LONGLIVE = f"""LongLive text-to-video, 30 s, with a 2-bit KV cache + Jensen bias correction

Wan 2.1 T2V 1.3B, chunk-wise autoregressive, as LongLive 1.0's inference config has it: 832x480,
477 frames = 120 latent frames, 3 latent frames per chunk (40 chunks), cfg 1. Its short window with
a frame sink: local_attn_size 12 and sink_size 3 latent frames are a cache window of 2 chunks plus an
attention sink of 1 (the first chunk stays cached for the whole video): local_attn_size = (sink + window
+ 1) x 3 = 12, the current chunk included; sink_size = 1 x 3. The cache never holds more than 3 chunks.
Schedule: AR Video Schedule, preset longlive_4step: LongLive's denoising steps [1000, 750, 500, 250]
warped with shift 5 (its timestep_shift), i.e. the model sees t = 1000, 937.5, 833.3, 625 (sigma =
t / 1000; the last step goes to 0). LCM sampler: predict x0, then re-noise with fresh noise.
The KV cache of finished chunks is stored in INT2 (group 32, FP8 scales) + Jensen bias correction.
Prompt switches (a Prompt Schedule on positive) re-cache as LongLive does (the sampler's recache_mode
longlive, its _recache_after_switch): the sink keeps the old prompt's K/V, the window and the chunk
about to be evicted are recomputed under the new prompt in one forward. recache_mode causal is the
pack's own re-cache, not LongLive's: it re-writes the sink under the new prompt too.

{_COMMON_FILES}
{_LONGLIVE_FILE}

{_PLANNER_TIP}"""

_KREA_FILE = f"""- models/diffusion_models/{KREA}
  Krea Realtime 14B (Wan 2.1 T2V 14B, Self-Forcing-trained): daydreamlive/krea-realtime-video ships
  krea-realtime-video-14b.safetensors, whose keys may carry a training prefix (model.). Load AR Video
  Checkpoint strips it at load (the tensors as stored): no conversion step.
  (tools/convert_checkpoint.py krea-realtime-video-14b.safetensors krea_realtime_video_14b.safetensors makes
  a copy for Load Diffusion Model once.)"""

#: Krea's settings (daydreamlive/scope krea_realtime_video: model.yaml, pipeline.py, schema.py)
KREA_SAMPLER = {
    "chunk_frames": 3,
    "window_chunks": 0,
    "sink_chunks": 0,
    "recompute_frames": 3,
    "kv_cache_attention_bias": 0.3,
}

NOTE_KREA = f"""Krea Realtime 14B text-to-video with Krea's cache settings + a 2-bit KV cache + Jensen bias correction

Wan 2.1 T2V 14B trained with Self-Forcing, as Krea runs it (daydreamlive/scope krea_realtime_video):
576x320 (its default), 81 frames = 21 latent frames, 3 latent frames per block (num_frame_per_block 3,
7 chunks), cfg 1. Before every chunk the sampler rebuilds the cache from the last 3 latent frames
(recompute_frames = kv_cache_num_frames 3) at t = 0, at RoPE frames 0-2, the chunk at 3-5 (Krea's
local_attn_size 6 = 3 cached + 3 current). The first of the 3 is re-encoded from decoded pixels
through the VAE wired into the sampler, as Krea does (without a VAE the latent frame is used as it is).
kv_cache_attention_bias 0.3 (Krea's default) adds log(0.3) to the scores of the cached keys except the
first cached frame, so the past weighs less (less drift and repetition).
Schedule: AR Video Schedule, preset manual "1000, 750, 500, 250": Krea passes these timesteps
unwarped (sigma = t / 1000); LCM sampler: predict x0, then re-noise with fresh noise, as Krea does.
The cache (3 frames) is stored in INT2 (group 32, FP8 scales) with the Jensen correction; the attention
bias and the correction are applied in the same pass. See docs/checkpoints.md for what differs from Krea.

{_COMMON_FILES}
{_KREA_FILE}

{_PLANNER_TIP}"""

NOTE_SKYREELS = f"""SkyReels-V2 Diffusion Forcing (1.3B, 540P) with cfg 6: both CFG branches cached in INT2 + Jensen

Wan 2.1 T2V architecture, 960x544, 97 frames = 25 latent frames, 5 latent frames per chunk
(5 chunks), cfg 6. With cfg > 1 the sampler keeps a second cache for the negative (uncond) branch,
so the cache costs twice as much: the planner on Quantize KV Cache shows "cfg branches 2".

{_SKYREELS_MODE}

{_COMMON_FILES}
{_SKYREELS_FILE}

{_PLANNER_TIP}"""

NOTE_AB = f"""A/B: the same seed through a BF16 cache, an INT2 cache, and INT2 + Jensen bias correction

Three Chunked AR samplers share the model, prompt, latent, schedule and seed (42, fixed):
  left   - BF16 cache: no patch nodes, the sampler keeps full-precision keys and values;
  middle - INT2 cache: Quantize KV Cache, no correction;
  right  - INT2 + Jensen: Quantize KV Cache -> Jensen Bias Correction (taylor, strength 1).
The three decoded videos are stitched side by side into one animated WEBP (jensen_kv/ab_*.webp).
Each sampler reports its cache size and seconds per chunk on the node.
{_SCHEDULE_SF}

{_COMMON_FILES}
{_SELF_FORCING_FILE}

{_PLANNER_TIP}"""

NOTE_STORY = f"""A story in one video: the prompt changes at chunks 0, 5 and 10 (Self-Forcing, INT2 + Jensen)

Three CLIPTextEncode prompts chained through Prompt Schedule nodes (start_chunk 0, 5, 10) go to the
sampler's positive. 832x480, 161 frames = 41 latent frames = 14 chunks of 3, cache window 6 chunks
plus an attention sink of 1 (the first chunk stays cached for the whole video; Self-Forcing's
local_attn_size = (sink + window + 1) x 3 = 24 latent frames, sink_size = 3). On each switch the
sampler re-caches as LongLive does (recache_mode longlive, NVlabs/LongLive's _recache_after_switch):
the sink keeps the old prompt's K/V and the window plus the chunk about to be evicted are recomputed
under the new prompt in one forward. recache_mode causal is the pack's own re-cache, not LongLive's:
every kept chunk, the sink included, re-written under the new prompt one chunk per forward.
recache_on_switch (both under the sampler's advanced inputs) off keeps the old entries. The report
says where each prompt started and how many chunks each switch re-cached.
The sampler's kv_cache output goes to Save KV Cache ({STORY_CACHE}):
open "continue from a saved KV cache" to go on with this video later.
{_SCHEDULE_SF}

{_COMMON_FILES}
{_SELF_FORCING_FILE}"""

NOTE_CONTINUE = f"""Continue a saved video later: Load KV Cache -> the same sampler settings -> more chunks

Load KV Cache reads a file Save KV Cache wrote (here the story workflow's {STORY_CACHE}):
every layer's quantized K/V, the sink, the next frame for RoPE, the prompt it ended with, and a
fingerprint of the model. The sampler continues at that chunk: with the same seed, the chunks equal
what one longer run would have made, bit for bit. It refuses a cache made with another model, a
different Quantize KV Cache setting, chunk length, window, sink or video size, and says which.
The new frames only are decoded here (the earlier ones are in the first run's video).
Pick a new prompt: the sampler re-caches the kept chunks under it before the first new chunk.

{_COMMON_FILES}
{_SELF_FORCING_FILE}"""

NOTE_EXTEND_SF = f"""Extend a clip with Self-Forcing (INT2 + Jensen): any video as the start, new frames after it

Load Video (ComfyUI/input/{CLIP_IN}: put your clip there or pick another) -> frames scaled to 832x480
-> VAE Encode -> the sampler's prefix: the clip's latent frames are written into the KV cache as the
first chunks (prefill), and generation continues after them. include_prefix (advanced) puts the clip
in front of the output, so the saved video is clip + continuation. Self-Forcing's "extend" (issue 39
of its repository) is exactly this: the clip stands where the earlier chunks would be.
{_SCHEDULE_SF}

{_COMMON_FILES}
{_SELF_FORCING_FILE}"""

NOTE_EXTEND_SKYREELS = f"""Extend a clip with SkyReels-V2 DF (cfg 6, INT2 + Jensen): SkyReels' video extension

Load Video (ComfyUI/input/{CLIP_IN}) -> frames scaled to 960x544 -> VAE Encode -> the sampler's
prefix: the clip becomes the first chunks of the cache and the model continues it, like
SkyReels-V2's video-extension mode (its prefix_video, with addnoise_condition 0).

{_SKYREELS_MODE}

{_COMMON_FILES}
{_SKYREELS_FILE}"""

NOTE_TINY = """Tiny AR demo - runs on a CPU, no download: the pack's tiny trained AR model, one seed through three caches

jensen-kv-tiny-ar is a 6M-parameter Wan 2.1 model (2 heads x 128, 4 blocks) trained by this pack on
synthetic latent videos: coloured balls that bounce and occlude over a panning texture
(custom_nodes/comfyui-jensen-kv/models/tiny_ar, bundled: Load Diffusion Model lists it, nothing to
download). It knows six prompts (Tiny AR Prompt) and needs no text encoder and no VAE (Tiny AR
Decode draws the frames with the bundled tiny decoder). 128x128 pixels (16x16 latents), 24 latent frames = 8 chunks
of 3, cache window 3 chunks (its training window), 8 euler steps with shift 3, seed 42.
  left   - full precision: the cache as the model keeps it (no patch nodes);
  middle - INT2: the cache in 2 bits (group 32, QuaRot), about 6x smaller;
  right  - INT2 + Jensen: the same cache with the Jensen bias correction.
Compare Panels labels each panel and writes its PSNR against full precision above it (higher
is closer). On this tiny model the three panels can look alike: then read the numbers over
them (Compare Panels also shows them as text). Saved as an animated WEBP
(jensen_kv/tiny_ab_*.webp). It runs in under a minute on 2 CPU cores. A proxy with learned
attention - not a substitute for Wan."""

PROMPT = (
    "A red fox trotting through fresh snow in a birch forest at golden hour, soft light, "
    "shallow depth of field, the camera tracking alongside it"
)
PROMPT_SKYREELS = (
    "A sailboat gliding across a calm turquoise bay, gentle waves, seagulls overhead, "
    "cinematic wide shot, late afternoon sun"
)
NEGATIVE = (
    "blurry, low quality, distorted, overexposed, static, jpeg artifacts, extra limbs, "
    "deformed, watermark, text, subtitles"
)
STORY = (
    ("A lighthouse on a rocky coast at dawn, calm sea, soft pink light, seagulls circling", "dawn"),
    ("The same lighthouse as storm clouds roll in, wind whipping the waves against the rocks", "storm"),
    ("The lighthouse beam sweeping through heavy rain at night, waves crashing, lightning", "night storm"),
)


def _n(key, type_, col, widgets=None, title=None, size=None, color=None, bgcolor=None, align=None, below=None):
    """A node in layout column ``col``, stacked in spec order; ``align``: top no higher than that node's
    top; ``below``: top under that node's bottom (both name nodes placed earlier in the list)."""
    return {
        "key": key,
        "type": type_,
        "col": col,
        "widgets": widgets or {},
        "title": title,
        "size": size,
        "color": color,
        "bgcolor": bgcolor,
        "align": align,
        "below": below,
    }


def _save_webp(prefix, fps, col, align=None):
    """The video's save node: Save Animated WEBP, whose inputs are the same on every supported ComfyUI (v0.3.64's
    V1 node, v0.27's and 0.33's V3 node). Create Video + Save Video would give MP4, but 0.33 made Save Video's
    ``format`` a dynamic combo that reads v0.27's widget values differently, so the shipped files avoid it."""
    widgets = {"filename_prefix": prefix, "fps": fps, "lossless": False, "quality": 90, "method": "default"}
    return _n("save", "SaveAnimatedWEBP", col, widgets, align=align, size=[400, 360])


def _note(text, size=(560, 640)):
    return _n(
        "note",
        "Note",
        0,
        {"text": text},
        title="Read me: model files and what this does",
        size=list(size),
        color="#432",
        bgcolor="#653",
    )


#: the checkpoints Load AR Video Checkpoint reads as published, with the LoRA each merges at load
AR_CHECKPOINTS = {
    SELF_FORCING: NO_LORA,
    CAUSVID: NO_LORA,
    LONGLIVE: LONGLIVE_LORA,
    KREA: NO_LORA,
    CAUSAL_FORCING: NO_LORA,
}


def _model_loader(unet, causal=False):
    """Load AR Video Checkpoint for a checkpoint as published (``causal``: core's WAN21_CausalAR), else UNETLoader."""
    if unet in AR_CHECKPOINTS:
        widgets = {"ckpt_name": unet, "lora_name": AR_CHECKPOINTS[unet], "weights": "auto", "weight_dtype": "default",
                   "causal": causal}  # fmt: skip
        return _n("unet", "JensenKVLoadARCheckpoint", 1, widgets, size=[340, 180])
    assert not causal, f"{unet} is loaded by UNETLoader: its file says whether it is causal"
    return _n("unet", "UNETLoader", 1, {"unet_name": unet, "weight_dtype": "default"}, size=[340, 90])


def _loaders(unet=SELF_FORCING, shift=None, causal=False):
    nodes = [_model_loader(unet, causal)]
    if shift is not None:
        nodes.append(_n("shift", "ModelSamplingSD3", 1, {"shift": shift}))
    return nodes + [
        _n("clip", "CLIPLoader", 1, {"clip_name": TEXT_ENCODER, "type": "wan", "device": "default"}, size=[340, 110]),
        _n("vae", "VAELoader", 1, {"vae_name": VAE}, size=[340, 60]),
    ]


SF_SCHEDULE = {"preset": "self_forcing_4step", "steps": 30, "shift": 8.0, "manual": "1, 0.757, 0.522"}
SAMPLER_SF = {
    "seed": 42,
    "control_after_generate": "fixed",
    "cfg": 1.0,
    "chunk_frames": 3,
    "window_chunks": 0,
    "context_noise": 0.0,
    "sink_chunks": 0,
    "include_prefix": True,
    "recache_on_switch": True,
}


def _few_step(unet, note, name, schedule, prefix_out, title):
    nodes = [
        _note(note),
        *_loaders(unet),
        _n("pos", "CLIPTextEncode", 2, {"text": PROMPT}, title="Prompt", size=[400, 160]),
        _n("neg", "ConditioningZeroOut", 2, title="Negative (unused at cfg 1)"),
        _n("latent", "EmptyHunyuanLatentVideo", 2, {"width": 832, "height": 480, "length": 81, "batch_size": 1}),
        _n("select", "KSamplerSelect", 2, {"sampler_name": "lcm"}, title="Sampler (LCM: x0, then fresh noise)"),
        _n("sched", "JensenKVARSchedule", 2, schedule, title=title),
        _n("quant", "JensenKVQuantizeKVCache", 3, QUANT_INT2),
        _n("jensen", "JensenKVBiasCorrection", 4, JENSEN_TAYLOR),
        _n("sampler", "JensenKVChunkedARSampler", 5, SAMPLER_SF),
        _n("decode", "VAEDecode", 6),
        _save_webp(prefix_out, 16.0, 6),
    ]
    links = [
        ("unet", "MODEL", "quant", "model"),
        ("quant", "MODEL", "jensen", "model"),
        ("jensen", "MODEL", "sampler", "model"),
        ("clip", "CLIP", "pos", "clip"),
        ("pos", "CONDITIONING", "neg", "conditioning"),
        ("pos", "CONDITIONING", "sampler", "positive"),
        ("neg", "CONDITIONING", "sampler", "negative"),
        ("latent", "LATENT", "sampler", "latent"),
        ("select", "SAMPLER", "sampler", "sampler"),
        ("sched", "SIGMAS", "sampler", "sigmas"),
        ("sampler", "LATENT", "decode", "samples"),
        ("vae", "VAE", "decode", "vae"),
        ("decode", "IMAGE", "save", "images"),
    ]
    return {"name": name, "nodes": nodes, "links": links, "groups": []}


def _self_forcing() -> dict:
    return _few_step(
        SELF_FORCING,
        NOTE_SELF_FORCING,
        "03 Self-Forcing text to video",
        SF_SCHEDULE,
        "jensen_kv/self_forcing_int2_jensen",
        "Self-Forcing schedule (t = 1000, 937.5, 833.3, 625)",
    )


def _longlive() -> dict:
    spec = _few_step(
        LONGLIVE,
        NOTE_LONGLIVE,
        "06 LongLive 30 s text to video",
        {**SF_SCHEDULE, "preset": "longlive_4step"},
        "jensen_kv/longlive_int2_jensen",
        "LongLive schedule (t = 1000, 937.5, 833.3, 625)",
    )
    for node in spec["nodes"]:
        if node["key"] == "latent":
            node["widgets"] = {**node["widgets"], "length": 477}  # num_output_frames 120 (latent)
        if node["key"] == "sampler":
            node["widgets"] = {**node["widgets"], **LONGLIVE_WINDOW, "recache_mode": "longlive"}
            node["title"] = "Chunked AR Video Sampler (window 2 + sink 1 = LongLive's 12 / 3 frames)"
    return spec


_CAUSAL_FORCING_FILE = f"""- models/diffusion_models/{CAUSAL_FORCING}
  Causal Forcing++ frame-wise 2-step (Wan 2.1 T2V 1.3B): zhuhz22/Causal-Forcing ships
  causal-forcing++/framewise-2step.pt, published under that generic name: saved under this one, it loads.
  Its README samples with --use_ema (generator_ema, what Load AR Video Checkpoint's weights auto takes):
  no conversion step.
  (tools/convert_checkpoint.py stays the way to make a smaller BF16 file for Load Diffusion Model once.)"""

NOTE_CAUSAL_FORCING = f"""Causal Forcing++ frame-wise 2-step text-to-video with INT2 + Jensen

Causal Forcing's frame-wise models make one latent frame per block: chunk_frames 1, 832x480, 81 frames
= 21 latent frames = 21 chunks, cfg 1, LCM (predict x0, re-noise with fresh noise), as its
configs/causal_forcing_dmd_framewise_2step.yaml and pipeline/causal_inference.py have it.
Schedule: AR Video Schedule, preset causal_forcing_framewise_2step: [1000, 500] warped with shift 5,
t = 1000, 833.3 for every frame but the first. The first frame runs on its own 4-step list
(denoising_step_list_first_chunk): t = 1000, 937.5, 833.3, 625, the second AR Video Schedule
(causal_forcing_framewise_4step) on the sampler's first_chunk_sigmas. The 2-step preset's SIGMAS carry
that schedule as well, so the first frame keeps its 4 steps if first_chunk_sigmas is left unconnected;
SIGMAS with these values that lost it (SplitSigmas, a manual list) make the sampler warn in its report.
The 1-step model (framewise-1step.pt): preset causal_forcing_framewise_1step, the same first schedule.

{_COMMON_FILES}
{_CAUSAL_FORCING_FILE}

{_PLANNER_TIP}"""


def _causal_forcing() -> dict:
    spec = _few_step(
        CAUSAL_FORCING,
        NOTE_CAUSAL_FORCING,
        "08 Causal Forcing frame-wise 2-step",
        {**SF_SCHEDULE, "preset": "causal_forcing_framewise_2step"},
        "jensen_kv/causal_forcing_2step_int2_jensen",
        "Causal Forcing++ 2-step schedule (t = 1000, 833.3)",
    )
    for node in spec["nodes"]:
        if node["key"] == "sampler":
            node["widgets"] = {**node["widgets"], "chunk_frames": 1}
            node["title"] = "Chunked AR Video Sampler (frame-wise: chunk_frames 1)"
    spec["nodes"].append(
        _n(
            "sched_first",
            "JensenKVARSchedule",
            2,
            {**SF_SCHEDULE, "preset": "causal_forcing_framewise_4step"},
            title="First frame's schedule (t = 1000, 937.5, 833.3, 625)",
        )
    )
    spec["links"].append(("sched_first", "SIGMAS", "sampler", "first_chunk_sigmas"))
    return spec


def _krea() -> dict:
    spec = _few_step(
        KREA,
        NOTE_KREA,
        "09 Krea Realtime 14B text to video",
        {**SF_SCHEDULE, "preset": "manual", "manual": "1000, 750, 500, 250"},
        "jensen_kv/krea_realtime_int2_jensen",
        "Krea schedule (t = 1000, 750, 500, 250, unwarped)",
    )
    for node in spec["nodes"]:
        if node["key"] == "latent":
            node["widgets"] = {**node["widgets"], "width": 576, "height": 320}
        if node["key"] == "sampler":
            node["widgets"] = {**node["widgets"], **KREA_SAMPLER}
            node["title"] = "Chunked AR Video Sampler (Krea: recompute 3 frames, attention bias 0.3)"
    spec["links"].append(("vae", "VAE", "sampler", "vae"))
    return spec


def _causvid() -> dict:
    return _few_step(
        CAUSVID,
        NOTE_CAUSVID,
        "05 CausVid text to video",
        {**SF_SCHEDULE, "preset": "causvid_3step"},
        "jensen_kv/causvid_int2_jensen",
        "CausVid 3-step schedule (t = 1000, 757, 522)",
    )


def _skyreels_sampling():
    return [
        _n("select", "KSamplerSelect", 2, {"sampler_name": "uni_pc_bh2"}, title="Sampler (UniPC bh2 ~ FlowUniPC)"),
        _n(
            "sched",
            "BasicScheduler",
            2,
            {"scheduler": "simple", "steps": 30, "denoise": 1.0},
            title="30 steps (simple, shift 8)",
        ),
    ]


SAMPLER_SKYREELS = {**SAMPLER_SF, "seed": 7, "cfg": 6.0, "chunk_frames": 5}


def _skyreels() -> dict:
    nodes = [
        _note(NOTE_SKYREELS, size=(560, 900)),
        *_loaders(unet=SKYREELS_DF, shift=8.0),
        _n("pos", "CLIPTextEncode", 2, {"text": PROMPT_SKYREELS}, title="Prompt", size=[400, 160]),
        _n("neg", "CLIPTextEncode", 2, {"text": NEGATIVE}, title="Negative prompt", size=[400, 130]),
        _n("latent", "EmptyHunyuanLatentVideo", 2, {"width": 960, "height": 544, "length": 97, "batch_size": 1}),
        *_skyreels_sampling(),
        _n("quant", "JensenKVQuantizeKVCache", 3, QUANT_INT2),
        _n("jensen", "JensenKVBiasCorrection", 4, JENSEN_TAYLOR),
        _n("sampler", "JensenKVChunkedARSampler", 5, SAMPLER_SKYREELS),
        _n("decode", "VAEDecode", 6),
        _save_webp("jensen_kv/skyreels_df_cfg6_int2_jensen", 24.0, 6),
    ]
    links = [
        ("unet", "MODEL", "shift", "model"),
        ("shift", "MODEL", "quant", "model"),
        ("shift", "MODEL", "sched", "model"),
        ("quant", "MODEL", "jensen", "model"),
        ("jensen", "MODEL", "sampler", "model"),
        ("clip", "CLIP", "pos", "clip"),
        ("clip", "CLIP", "neg", "clip"),
        ("pos", "CONDITIONING", "sampler", "positive"),
        ("neg", "CONDITIONING", "sampler", "negative"),
        ("latent", "LATENT", "sampler", "latent"),
        ("select", "SAMPLER", "sampler", "sampler"),
        ("sched", "SIGMAS", "sampler", "sigmas"),
        ("sampler", "LATENT", "decode", "samples"),
        ("vae", "VAE", "decode", "vae"),
        ("decode", "IMAGE", "save", "images"),
    ]
    return {"name": "07 SkyReels-V2 DF with cfg 6", "nodes": nodes, "links": links, "groups": []}


def _ab() -> dict:
    seed = dict(SAMPLER_SF)
    stitch = {"direction": "right", "match_image_size": True, "spacing_width": 8, "spacing_color": "white"}
    nodes = [
        _note(NOTE_AB),
        *_loaders(),
        _n("pos", "CLIPTextEncode", 2, {"text": PROMPT}, title="Prompt", size=[400, 160]),
        _n("neg", "ConditioningZeroOut", 2, title="Negative (unused at cfg 1)"),
        _n("latent", "EmptyHunyuanLatentVideo", 2, {"width": 832, "height": 480, "length": 81, "batch_size": 1}),
        _n("select", "KSamplerSelect", 2, {"sampler_name": "lcm"}, title="Sampler (LCM: x0, then fresh noise)"),
        _n("sched", "JensenKVARSchedule", 2, SF_SCHEDULE, title="Self-Forcing schedule"),
        # arm A: no patch nodes; arms B and C in the rows below, patch nodes in column 3
        _n("s_bf16", "JensenKVChunkedARSampler", 4, seed, title="A: BF16 cache (baseline)"),
        _n("d_bf16", "VAEDecode", 5, align="s_bf16"),
        _n("quant", "JensenKVQuantizeKVCache", 3, QUANT_INT2, below="s_bf16"),
        _n("s_int2", "JensenKVChunkedARSampler", 4, seed, title="B: INT2 cache", align="quant"),
        _n("d_int2", "VAEDecode", 5, align="s_int2"),
        _n("jensen", "JensenKVBiasCorrection", 3, JENSEN_TAYLOR, below="s_int2"),
        _n("s_jensen", "JensenKVChunkedARSampler", 4, seed, title="C: INT2 + Jensen", align="jensen"),
        _n("d_jensen", "VAEDecode", 5, align="s_jensen"),
        _n("stitch1", "ImageStitch", 6, stitch, title="A | B", align="s_int2"),
        _n("stitch2", "ImageStitch", 6, stitch, title="A | B | C"),
        _save_webp("jensen_kv/ab_bf16_int2_int2jensen", 16.0, 7, align="s_int2"),
    ]
    links = [
        ("unet", "MODEL", "s_bf16", "model"),
        ("unet", "MODEL", "quant", "model"),
        ("quant", "MODEL", "s_int2", "model"),
        ("quant", "MODEL", "jensen", "model"),
        ("jensen", "MODEL", "s_jensen", "model"),
        ("clip", "CLIP", "pos", "clip"),
        ("pos", "CONDITIONING", "neg", "conditioning"),
    ]
    for s, d in (("s_bf16", "d_bf16"), ("s_int2", "d_int2"), ("s_jensen", "d_jensen")):
        links += [
            ("pos", "CONDITIONING", s, "positive"),
            ("neg", "CONDITIONING", s, "negative"),
            ("latent", "LATENT", s, "latent"),
            ("select", "SAMPLER", s, "sampler"),
            ("sched", "SIGMAS", s, "sigmas"),
            (s, "LATENT", d, "samples"),
            ("vae", "VAE", d, "vae"),
        ]
    links += [
        ("d_bf16", "IMAGE", "stitch1", "image1"),
        ("d_int2", "IMAGE", "stitch1", "image2"),
        ("stitch1", "IMAGE", "stitch2", "image1"),
        ("d_jensen", "IMAGE", "stitch2", "image2"),
        ("stitch2", "IMAGE", "save", "images"),
    ]
    groups = [
        {"title": "A: BF16 cache (no patch nodes)", "members": ["s_bf16", "d_bf16"], "color": "#3f789e"},
        {"title": "B: INT2 cache", "members": ["quant", "s_int2", "d_int2"], "color": "#a1309b"},
        {"title": "C: INT2 + Jensen bias correction", "members": ["jensen", "s_jensen", "d_jensen"], "color": "#8A8"},
    ]
    return {
        "name": "04 Same seed - BF16, INT2, INT2 + Jensen",
        "nodes": nodes,
        "links": links,
        "groups": groups,
        "gap_y": 110,
    }


def _story() -> dict:
    sampler = {**SAMPLER_SF, "window_chunks": 6, "sink_chunks": 1, "recache_mode": "longlive"}
    nodes = [
        _note(NOTE_STORY, size=(560, 760)),
        *_loaders(),
        _n(
            "p0",
            "CLIPTextEncode",
            2,
            {"text": STORY[0][0]},
            title=f"Prompt from chunk 0 ({STORY[0][1]})",
            size=[400, 130],
        ),
        _n(
            "p1",
            "CLIPTextEncode",
            2,
            {"text": STORY[1][0]},
            title=f"Prompt from chunk 5 ({STORY[1][1]})",
            size=[400, 130],
        ),
        _n(
            "p2",
            "CLIPTextEncode",
            2,
            {"text": STORY[2][0]},
            title=f"Prompt from chunk 10 ({STORY[2][1]})",
            size=[400, 130],
        ),
        _n("neg", "ConditioningZeroOut", 2, title="Negative (unused at cfg 1)"),
        _n("latent", "EmptyHunyuanLatentVideo", 2, {"width": 832, "height": 480, "length": 161, "batch_size": 1}),
        _n("select", "KSamplerSelect", 2, {"sampler_name": "lcm"}, title="Sampler (LCM)"),
        _n("sched", "JensenKVARSchedule", 2, SF_SCHEDULE, title="Self-Forcing schedule"),
        _n("s0", "JensenKVPromptSchedule", 3, {"start_chunk": 0, "label": STORY[0][1]}),
        _n("s1", "JensenKVPromptSchedule", 3, {"start_chunk": 5, "label": STORY[1][1]}),
        _n("s2", "JensenKVPromptSchedule", 3, {"start_chunk": 10, "label": STORY[2][1]}),
        _n("quant", "JensenKVQuantizeKVCache", 4, QUANT_INT2),
        _n("jensen", "JensenKVBiasCorrection", 4, JENSEN_TAYLOR),
        _n("sampler", "JensenKVChunkedARSampler", 5, sampler),
        _n("savekv", "JensenKVSaveKVCache", 5, {"filename_prefix": "jensen_kv/story_kv_cache"}),
        _n("decode", "VAEDecode", 6),
        _save_webp("jensen_kv/story_int2_jensen", 16.0, 6),
    ]
    links = [
        ("unet", "MODEL", "quant", "model"),
        ("quant", "MODEL", "jensen", "model"),
        ("jensen", "MODEL", "sampler", "model"),
        ("clip", "CLIP", "p0", "clip"),
        ("clip", "CLIP", "p1", "clip"),
        ("clip", "CLIP", "p2", "clip"),
        ("p0", "CONDITIONING", "neg", "conditioning"),
        ("p0", "CONDITIONING", "s0", "conditioning"),
        ("p1", "CONDITIONING", "s1", "conditioning"),
        ("p2", "CONDITIONING", "s2", "conditioning"),
        ("s0", "CONDITIONING", "s1", "schedule"),
        ("s1", "CONDITIONING", "s2", "schedule"),
        ("s2", "CONDITIONING", "sampler", "positive"),
        ("neg", "CONDITIONING", "sampler", "negative"),
        ("latent", "LATENT", "sampler", "latent"),
        ("select", "SAMPLER", "sampler", "sampler"),
        ("sched", "SIGMAS", "sampler", "sigmas"),
        ("sampler", "JENSEN_KV_CACHE", "savekv", "kv_cache"),
        ("sampler", "LATENT", "decode", "samples"),
        ("vae", "VAE", "decode", "vae"),
        ("decode", "IMAGE", "save", "images"),
    ]
    return {"name": "16 Story with a prompt schedule", "nodes": nodes, "links": links, "groups": []}


def _continue() -> dict:
    sampler = {**SAMPLER_SF, "window_chunks": 6, "sink_chunks": 1}
    nodes = [
        _note(NOTE_CONTINUE, size=(560, 640)),
        *_loaders(),
        _n("load", "JensenKVLoadKVCache", 2, {"cache_file": STORY_CACHE_NAME}, size=[420, 90]),
        _n(
            "pos",
            "CLIPTextEncode",
            2,
            {"text": STORY[2][0]},
            title="Prompt (the one the cache ended with, or a new one)",
            size=[400, 130],
        ),
        _n("neg", "ConditioningZeroOut", 2, title="Negative (unused at cfg 1)"),
        _n(
            "latent",
            "EmptyHunyuanLatentVideo",
            2,
            {"width": 832, "height": 480, "length": 81, "batch_size": 1},
            title="New frames (same size as the saved video)",
        ),
        _n("select", "KSamplerSelect", 2, {"sampler_name": "lcm"}, title="Sampler (LCM)"),
        _n("sched", "JensenKVARSchedule", 2, SF_SCHEDULE, title="Self-Forcing schedule"),
        _n("quant", "JensenKVQuantizeKVCache", 3, QUANT_INT2, title="Quantize KV Cache (as when saved)"),
        _n("jensen", "JensenKVBiasCorrection", 3, JENSEN_TAYLOR),
        _n("sampler", "JensenKVChunkedARSampler", 4, sampler, title="Chunked AR Video Sampler (same settings)"),
        _n("decode", "VAEDecode", 5),
        _save_webp("jensen_kv/story_continued", 16.0, 5),
    ]
    links = [
        ("unet", "MODEL", "quant", "model"),
        ("quant", "MODEL", "jensen", "model"),
        ("jensen", "MODEL", "sampler", "model"),
        ("clip", "CLIP", "pos", "clip"),
        ("pos", "CONDITIONING", "neg", "conditioning"),
        ("pos", "CONDITIONING", "sampler", "positive"),
        ("neg", "CONDITIONING", "sampler", "negative"),
        ("latent", "LATENT", "sampler", "latent"),
        ("select", "SAMPLER", "sampler", "sampler"),
        ("sched", "SIGMAS", "sampler", "sigmas"),
        ("load", "JENSEN_KV_CACHE", "sampler", "kv_cache"),
        ("sampler", "LATENT", "decode", "samples"),
        ("vae", "VAE", "decode", "vae"),
        ("decode", "IMAGE", "save", "images"),
    ]
    return {"name": "19 Continue from a saved KV cache", "nodes": nodes, "links": links, "groups": []}


def _extend(model: str) -> dict:
    sky = model == "skyreels"
    width, height = (960, 544) if sky else (832, 480)
    sampler = {**(SAMPLER_SKYREELS if sky else SAMPLER_SF), "include_prefix": True}
    nodes = [
        _note(NOTE_EXTEND_SKYREELS if sky else NOTE_EXTEND_SF, size=(560, 900 if sky else 640)),
        *_loaders(SKYREELS_DF if sky else SELF_FORCING, shift=8.0 if sky else None),
        _n("clipin", "LoadVideo", 2, {"file": CLIP_IN}, title="The clip to extend (ComfyUI/input)"),
        _n("frames", "GetVideoComponents", 2),
        _n("scale", "ImageScale", 2, {"upscale_method": "lanczos", "width": width, "height": height, "crop": "center"}),
        _n("encode", "VAEEncode", 2, title="VAE Encode (the clip's latent: the prefix)"),
        _n("pos", "CLIPTextEncode", 2, {"text": PROMPT_SKYREELS if sky else PROMPT}, title="Prompt", size=[400, 130]),
        (
            _n("neg", "CLIPTextEncode", 2, {"text": NEGATIVE}, title="Negative prompt", size=[400, 110])
            if sky
            else _n("neg", "ConditioningZeroOut", 2, title="Negative (unused at cfg 1)")
        ),
        _n(
            "latent",
            "EmptyHunyuanLatentVideo",
            2,
            {"width": width, "height": height, "length": 61 if sky else 49, "batch_size": 1},
            title="New frames after the clip",
        ),
        *(
            _skyreels_sampling()
            if sky
            else [
                _n("select", "KSamplerSelect", 2, {"sampler_name": "lcm"}, title="Sampler (LCM)"),
                _n("sched", "JensenKVARSchedule", 2, SF_SCHEDULE, title="Self-Forcing schedule"),
            ]
        ),
        _n("quant", "JensenKVQuantizeKVCache", 3, QUANT_INT2),
        _n("jensen", "JensenKVBiasCorrection", 4, JENSEN_TAYLOR),
        _n("sampler", "JensenKVChunkedARSampler", 5, sampler, title="Chunked AR Video Sampler (prefix = the clip)"),
        _n("decode", "VAEDecode", 6),
        _save_webp(f"jensen_kv/extend_{model}", 24.0 if sky else 16.0, 6),
    ]
    base = "shift" if sky else "unet"
    links = [
        *([("unet", "MODEL", "shift", "model"), ("shift", "MODEL", "sched", "model")] if sky else []),
        (base, "MODEL", "quant", "model"),
        ("quant", "MODEL", "jensen", "model"),
        ("jensen", "MODEL", "sampler", "model"),
        ("clipin", "VIDEO", "frames", "video"),
        ("frames", "IMAGE", "scale", "image"),
        ("scale", "IMAGE", "encode", "pixels"),
        ("vae", "VAE", "encode", "vae"),
        ("encode", "LATENT", "sampler", "prefix"),
        ("clip", "CLIP", "pos", "clip"),
        ("clip", "CLIP", "neg", "clip") if sky else ("pos", "CONDITIONING", "neg", "conditioning"),
        ("pos", "CONDITIONING", "sampler", "positive"),
        ("neg", "CONDITIONING", "sampler", "negative"),
        ("latent", "LATENT", "sampler", "latent"),
        ("select", "SAMPLER", "sampler", "sampler"),
        ("sched", "SIGMAS", "sampler", "sigmas"),
        ("sampler", "LATENT", "decode", "samples"),
        ("vae", "VAE", "decode", "vae"),
        ("decode", "IMAGE", "save", "images"),
    ]
    name = "18 Extend a clip with SkyReels-V2 DF" if sky else "17 Extend a clip with Self-Forcing"
    return {"name": name, "nodes": nodes, "links": links, "groups": []}


TINY_SAMPLER = {
    "seed": 42,
    "control_after_generate": "fixed",
    "cfg": 1.0,
    "chunk_frames": 3,
    "window_chunks": 3,
    "context_noise": 0.0,
    "sink_chunks": 0,
    "include_prefix": True,
    "recache_on_switch": True,
}


def _tiny_cpu_demo() -> dict:
    nodes = [
        _note(NOTE_TINY, size=(520, 560)),
        _n("unet", "UNETLoader", 1, {"unet_name": TINY_AR, "weight_dtype": "default"}, size=[340, 90]),
        _n("shift", "ModelSamplingSD3", 1, {"shift": 3.0}),
        _n(
            "pos",
            "JensenKVTinyARPrompt",
            2,
            {"prompt": "three balls bouncing fast over a cool texture"},
            size=[380, 60],
        ),
        _n("neg", "ConditioningZeroOut", 2, title="Negative (unused at cfg 1)"),
        _n(
            "latent",
            "EmptyHunyuanLatentVideo",
            2,
            {"width": 128, "height": 128, "length": 93, "batch_size": 1},
            title="24 latent frames of 16x16",
        ),
        _n("select", "KSamplerSelect", 2, {"sampler_name": "euler"}),
        _n("sched", "BasicScheduler", 2, {"scheduler": "simple", "steps": 8, "denoise": 1.0}),
        _n("s_fp", "JensenKVChunkedARSampler", 4, TINY_SAMPLER, title="A: full-precision cache"),
        _n("d_fp", "JensenKVTinyARDecode", 5, {"scale": 8, "decoder": "tiny decoder"}, align="s_fp"),
        _n("quant", "JensenKVQuantizeKVCache", 3, QUANT_INT2, below="s_fp"),
        _n("s_int2", "JensenKVChunkedARSampler", 4, TINY_SAMPLER, title="B: INT2 cache", align="quant"),
        _n("d_int2", "JensenKVTinyARDecode", 5, {"scale": 8, "decoder": "tiny decoder"}, align="s_int2"),
        _n("jensen", "JensenKVBiasCorrection", 3, JENSEN_TAYLOR, below="s_int2"),
        _n("s_jensen", "JensenKVChunkedARSampler", 4, TINY_SAMPLER, title="C: INT2 + Jensen", align="jensen"),
        _n("d_jensen", "JensenKVTinyARDecode", 5, {"scale": 8, "decoder": "tiny decoder"}, align="s_jensen"),
        _n(
            "compare",
            "JensenKVComparePanels",
            6,
            {"label_a": "full precision", "label_b": "INT2", "label_c": "INT2 + Jensen"},
            title="A | B | C, labelled, PSNR against A",
            align="s_int2",
            size=[300, 170],
        ),
        _n(
            "save",
            "SaveAnimatedWEBP",
            7,
            {"filename_prefix": "jensen_kv/tiny_ab", "fps": 8.0, "lossless": True, "quality": 90, "method": "default"},
            align="s_int2",
            size=[420, 300],
        ),
    ]
    links = [
        ("unet", "MODEL", "shift", "model"),
        ("shift", "MODEL", "sched", "model"),
        ("shift", "MODEL", "s_fp", "model"),
        ("shift", "MODEL", "quant", "model"),
        ("quant", "MODEL", "s_int2", "model"),
        ("quant", "MODEL", "jensen", "model"),
        ("jensen", "MODEL", "s_jensen", "model"),
        ("pos", "CONDITIONING", "neg", "conditioning"),
    ]
    for s, d in (("s_fp", "d_fp"), ("s_int2", "d_int2"), ("s_jensen", "d_jensen")):
        links += [
            ("pos", "CONDITIONING", s, "positive"),
            ("neg", "CONDITIONING", s, "negative"),
            ("latent", "LATENT", s, "latent"),
            ("select", "SAMPLER", s, "sampler"),
            ("sched", "SIGMAS", s, "sigmas"),
            (s, "LATENT", d, "samples"),
        ]
    links += [
        ("d_fp", "IMAGE", "compare", "image_a"),
        ("d_int2", "IMAGE", "compare", "image_b"),
        ("d_jensen", "IMAGE", "compare", "image_c"),
        ("compare", "IMAGE", "save", "images"),
    ]
    groups = [
        {"title": "A: full-precision cache (no patch nodes)", "members": ["s_fp", "d_fp"], "color": "#3f789e"},
        {"title": "B: INT2 cache", "members": ["quant", "s_int2", "d_int2"], "color": "#a1309b"},
        {"title": "C: INT2 + Jensen bias correction", "members": ["jensen", "s_jensen", "d_jensen"], "color": "#8A8"},
    ]
    return {
        "name": "01 Tiny AR demo - runs on a CPU, no download",
        "nodes": nodes,
        "links": links,
        "groups": groups,
        "gap_y": 110,
    }


NOTE_MAGI1 = f"""MAGI-1 4.5B distill, text to video, with a 2-bit KV cache + Jensen bias correction

MAGI-1 AR Sampler runs Sand AI's own pipeline: chunks of 24 frames (6 latent frames), 4 chunks denoised
together at their own noise levels (window_size 4), each reading a few chunks back (key ranges
5,4,3,2 over the quarters of its steps: the paper's "sliding window annealed from 5 to 2"), Euler on
the sd3 shift-3 schedule, 16 steps per chunk (the paper's and the 24B distill config's; the 4.5B
configs ship 64), cfg auto = 1 pass for a distilled model (with the nearly-clean blend). 720x720,
96 frames = 24 latent frames = 4 chunks, seed 1234 (the reference's defaults but the steps).
Finished chunks go into the pack's KV cache in INT2 (group 32, Hadamard rotation, FP8 scales: 2.75
bits/element) and Jensen Bias Correction (taylor) removes the attention they steal; the chunks
still in flight are attended in full precision. At window_size 4 every query reads exactly one
finished chunk, so the cache holds one chunk per layer: 0.27 GiB at 720x720 in INT2 against the
reference's whole-video buffer (15.8 GiB for 240 frames in BF16; benchmarks/magi1_memory.py).
Lower window_size (advanced: kv_ranges, window_chunks) trades speed for a longer cached context.

Model files (put them under ComfyUI/models/, then press R to refresh the loaders):
- models/diffusion_models/{MAGI1_DISTILL}
  models/diffusion_models/{MAGI1_DISTILL_2}
  Sand AI's MAGI-1 4.5B distill as published, no conversion: the two shards of huggingface sand-ai/MAGI-1
  ckpt/magi/4.5B_distill/inference_weight.distill/model-00001-of-00002.safetensors and
  model-00002-of-00002.safetensors, each saved under the name above (the Missing Models list downloads
  the first; Load MAGI-1 Model names the second if it is not there).
- models/diffusion_models/special_tokens.npz, beside them
  the caption's special tokens: example/assets/special_tokens.npz of github SandAI-org/MAGI-1 (the
  loader reads it from the shards' folder; without it the sampler says so before it starts).
  One file instead (smaller to move): convert_checkpoint.py 4.5B_distill/inference_weight.distill \\
      models/diffusion_models/magi1_4.5b_distill.safetensors --magi1 --special-tokens special_tokens.npz
- models/vae/{MAGI1_VAE}
  ckpt/vae/diffusion_pytorch_model.safetensors of the same repository, as it is, saved under this name
  (the Missing Models list downloads it; Load MAGI-1 VAE reads its config from the decoder's shapes).
- models/text_encoders/{T5_XXL}
  T5 v1.1 XXL (e.g. comfyanonymous/flux_text_encoders); load it with CLIPLoader type "pixart" (no padding),
  then MAGI-1 Text Encode.

Without Quantize KV Cache and Jensen Bias Correction the sampler keeps a full-precision cache: the
same workflow is the A/B baseline. The sampler's report gives the cache's bytes, its BF16 size, the
effective bits, the K/V heads (8 of 24) and what the reference's buffer would hold."""

MAGI1_SAMPLER = {
    "width": 720,
    "height": 720,
    "frames": 96,
    "seed": 1234,
    "control_after_generate": "fixed",
    "steps": 16,
    "window_size": 4,
    "cfg": "auto",
    "kv_ranges": "5,4,3,2",
    "window_chunks": 0,
    "sink_chunks": 0,
    "special_tokens": True,
}
PROMPT_MAGI1 = (
    "A red fox trotting through fresh snow in a birch forest at golden hour, soft light, the camera tracking "
    "alongside it"
)


def _magi1() -> dict:
    nodes = [
        _note(NOTE_MAGI1, size=(600, 820)),
        _n(
            "unet",
            "JensenKVLoadMagi1",
            1,
            {"model_name": MAGI1_DISTILL, "weight_dtype": "default", "variant": "distill"},
            size=[340, 110],
        ),  # fmt: skip
        _n("clip", "CLIPLoader", 1, {"clip_name": T5_XXL, "type": "pixart", "device": "default"}, size=[340, 110]),
        _n("vae", "JensenKVLoadMagi1VAE", 1, {"vae_name": MAGI1_VAE, "dtype": "auto"}, size=[340, 80]),
        _n("pos", "JensenKVMagi1TextEncode", 2, {"text": PROMPT_MAGI1, "clean": True}, title="Prompt", size=[400, 160]),
        _n("quant", "JensenKVQuantizeKVCache", 3, QUANT_INT2),
        _n("jensen", "JensenKVBiasCorrection", 4, JENSEN_TAYLOR),
        _n("sampler", "JensenKVMagi1ARSampler", 5, MAGI1_SAMPLER, size=[340, 330]),
        _n("decode", "JensenKVMagi1VAEDecode", 6),
        _save_webp("jensen_kv/magi1_int2_jensen", 24.0, 6),
    ]
    links = [
        ("unet", "MODEL", "quant", "model"),
        ("quant", "MODEL", "jensen", "model"),
        ("jensen", "MODEL", "sampler", "model"),
        ("clip", "CLIP", "pos", "clip"),
        ("pos", "CONDITIONING", "sampler", "positive"),
        ("sampler", "LATENT", "decode", "samples"),
        ("vae", "MAGI1_VAE", "decode", "magi1_vae"),
        ("decode", "IMAGE", "save", "images"),
    ]
    return {"name": "10 MAGI-1 4.5B distill text to video", "nodes": nodes, "links": links, "groups": []}


WORKFLOWS: list[dict] = [
    _self_forcing(),
    _longlive(),
    _causvid(),
    _skyreels(),
    _ab(),
    _story(),
    _continue(),
    _extend("self_forcing"),
    _extend("skyreels"),
    _tiny_cpu_demo(),
    _krea(),
    _causal_forcing(),
    _magi1(),
]

# JavaScript run in the page: builds one spec with LiteGraph and returns app.graph.serialize().
BUILD_JS = r"""
async (spec) => {
  const graph = app.graph;
  graph.clear();
  const byKey = {};
  for (const n of spec.nodes) {
    const node = LiteGraph.createNode(n.type);
    if (!node) throw new Error(`node type ${n.type} is not registered in the front end`);
    graph.add(node);
    if (n.title) node.title = n.title;
    if (n.color) node.color = n.color;
    if (n.bgcolor) node.bgcolor = n.bgcolor;
    for (const [name, value] of Object.entries(n.widgets)) {
      const w = node.widgets?.find((w) => w.name === name);
      if (!w) throw new Error(`${n.type} has no widget ${name}; it has ${node.widgets?.map((w) => w.name)}`);
      w.value = value;
    }
    byKey[n.key] = node;
  }
  for (const [src, out, dst, inp] of spec.links) {
    const a = byKey[src], b = byKey[dst];
    const o = a.outputs.findIndex((s) => s.name === out || s.type === out);
    const i = b.inputs.findIndex((s) => s.name === inp);
    if (o < 0 || i < 0) throw new Error(`cannot link ${src}.${out} -> ${dst}.${inp}`);
    if (!a.connect(o, b, i)) throw new Error(`front end refused link ${src}.${out} -> ${dst}.${inp}`);
  }
  // let the pack's extension render its panels (and store node.properties.jensen_kv_planner)
  const quants = graph.nodes.filter((n) => n.type === "JensenKVQuantizeKVCache");
  for (let t = 0; t < 100 && !quants.every((n) => n.properties?.jensen_kv_planner && n.jensenKv?.plan); t++) {
    await new Promise((r) => setTimeout(r, 100));
  }
  await new Promise((r) => setTimeout(r, 300));
  // layout: columns left to right (each as wide as its widest node); nodes placed in spec order,
  // stacked per column; "align": no higher than that node's top; "below": under that node's bottom
  const GAP_X = 60, GAP_Y = spec.gap_y ?? 40, TITLE = LiteGraph.NODE_TITLE_HEIGHT;
  for (const n of spec.nodes) {
    const node = byKey[n.key];
    const size = node.computeSize();
    node.setSize(n.size ? [Math.max(n.size[0], size[0]), Math.max(n.size[1], size[1])] : [Math.max(node.size[0], size[0]), size[1]]);
  }
  const cols = [...new Set(spec.nodes.map((n) => n.col))].sort((a, b) => a - b);
  const colX = {};
  let x = 0;
  for (const c of cols) {
    colX[c] = x;
    x += Math.max(...spec.nodes.filter((n) => n.col === c).map((n) => byKey[n.key].size[0])) + GAP_X;
  }
  const cursor = {};
  for (const n of spec.nodes) {
    const node = byKey[n.key];
    let y = cursor[n.col] ?? 0;
    if (n.align) y = Math.max(y, byKey[n.align].pos[1]);
    if (n.below) y = Math.max(y, byKey[n.below].pos[1] + byKey[n.below].size[1] + GAP_Y + TITLE);
    node.pos = [colX[n.col], y];
    cursor[n.col] = y + node.size[1] + GAP_Y + TITLE;
  }
  for (const g of spec.groups) {
    const group = new LiteGraph.LGraphGroup(g.title);
    group.color = g.color;
    graph.add(group);
    const members = g.members.map((k) => byKey[k]);
    const x0 = Math.min(...members.map((m) => m.pos[0])) - 15;
    const y0 = Math.min(...members.map((m) => m.pos[1])) - LiteGraph.NODE_TITLE_HEIGHT - 45;
    const x1 = Math.max(...members.map((m) => m.pos[0] + m.size[0])) + 15;
    const y1 = Math.max(...members.map((m) => m.pos[1] + m.size[1])) + 15;
    group.pos = [x0, y0];
    group.size = [x1 - x0, y1 - y0];
  }
  const data = graph.serialize();
  data.extra = { ...(data.extra ?? {}), ds: { scale: 0.8, offset: [40, 80] } };
  return JSON.parse(JSON.stringify(data));  // as the UI's Save writes it (undefined fields dropped)
}
"""


# ------------------------------------------------------------------------------ test-only workflow
TINY_UNET = "jensen_kv_tiny_wan.safetensors"  # written by the browser test (jensen_testing/wan_tiny.DETECTABLE)


def tiny_workflow() -> dict:
    """The tiny-model run of the nodes' server test, as a UI graph (needs tests/comfy_test_nodes).

    A random 2-layer Wan (1 head of 128) that UNETLoader detects as wan2.1, random conditioning in
    place of the text encoder, 32x32 pixels x 13 frames = 4 latent frames in chunks of 2, 2 euler
    steps, cfg 2 (two cached branches), INT2 + Jensen, the latent saved with SaveLatent.
    """
    nodes = [
        _n("unet", "UNETLoader", 0, {"unet_name": TINY_UNET, "weight_dtype": "default"}, size=[340, 90]),
        _n("pos", "JensenKVTestConditioning", 0, {"seed": 1, "tokens": 16, "width": 4096}, title="Positive (random)"),
        _n("neg", "JensenKVTestConditioning", 0, {"seed": 2, "tokens": 16, "width": 4096}, title="Negative (random)"),
        _n("latent", "EmptyHunyuanLatentVideo", 0, {"width": 32, "height": 32, "length": 13, "batch_size": 1}),
        _n("quant", "JensenKVQuantizeKVCache", 1, QUANT_INT2),
        _n("jensen", "JensenKVBiasCorrection", 2, JENSEN_TAYLOR),
        _n("select", "KSamplerSelect", 2, {"sampler_name": "euler"}),
        _n("sched", "BasicScheduler", 2, {"scheduler": "simple", "steps": 2, "denoise": 1.0}),
        _n(
            "sampler",
            "JensenKVChunkedARSampler",
            3,
            {
                "seed": 0,
                "control_after_generate": "fixed",
                "cfg": 2.0,
                "chunk_frames": 2,
                "window_chunks": 0,
                "context_noise": 0.0,
            },
        ),
        _n("save", "SaveLatent", 4, {"filename_prefix": "jensen_kv/browser_tiny"}),
    ]
    links = [
        ("unet", "MODEL", "quant", "model"),
        ("quant", "MODEL", "jensen", "model"),
        ("jensen", "MODEL", "sampler", "model"),
        ("unet", "MODEL", "sched", "model"),
        ("pos", "CONDITIONING", "sampler", "positive"),
        ("neg", "CONDITIONING", "sampler", "negative"),
        ("latent", "LATENT", "sampler", "latent"),
        ("select", "SAMPLER", "sampler", "sampler"),
        ("sched", "SIGMAS", "sampler", "sigmas"),
        ("sampler", "LATENT", "save", "samples"),
    ]
    return {"name": "tiny_wan_int2_jensen_cfg2", "nodes": nodes, "links": links, "groups": []}


# ============================================================================ ComfyUI's own AR sampler (v0.27+)
# Workflows on core's AR path: SamplerCustomAdvanced + SamplerARVideo over a causal-AR Wan (WAN21_CausalAR), the
# pack's nodes in front of the guider. SamplerARVideo, EmptyARVideoLatent and ARVideoI2V exist from ComfyUI v0.27 on:
# build_workflows.py builds these with a ComfyUI that has core's AR path (and the rest with the oldest supported
# one); their tests are marked core_ar (tests/web/conftest.py marks the shared per-file tests too).
SELF_FORCING_CAUSAL = SELF_FORCING  # Self-Forcing as published, loaded with causal on (Load AR Video Checkpoint)
CAUSAL_FORCING_FRAMEWISE = "causal_forcing-framewise.safetensors"  # the name ComfyUI's own Causal Forcing template uses
START_IMAGE = "jensen_kv_start_frame.png"  # the I2V workflow's start image (ComfyUI/input)
MODEL_FILES["diffusion_models"] = (*MODEL_FILES["diffusion_models"], CAUSAL_FORCING_FRAMEWISE)

_write_placeholder_files_before_core_ar = write_placeholder_files


def write_placeholder_files(base) -> None:  # noqa: F811 - extends the one above with the I2V start image
    """What the workflows' file widgets name (see above), and a real PNG start image for Load Image."""
    from pathlib import Path

    from PIL import Image

    _write_placeholder_files_before_core_ar(base)
    write_lingbot_release_placeholder(Path(base) / "models" / "diffusion_models")
    image = Image.new("RGB", (832, 480))
    image.putdata([(x * 255 // 831, y * 255 // 479, 128) for y in range(480) for x in range(832)])
    image.save(Path(base) / "input" / START_IMAGE)


_CORE_AR_NEEDS = """Needs ComfyUI v0.27 or later: SamplerARVideo, EmptyARVideoLatent and ARVideoI2V are core nodes from
v0.27 on, and the checkpoint must load as a causal-AR Wan (WAN21_CausalAR): Load AR Video Checkpoint
with causal on gives that class; a file loads as one in Load Diffusion Model when its metadata carries
the causal flag, which convert_checkpoint.py --causal writes (a checkpoint without it loads as plain
Wan 2.1, and SamplerARVideo refuses it). On older ComfyUI use the Chunked AR Video Sampler workflows."""

_CORE_AR_CACHE = """The pack's nodes take over core's KV cache (core's own is one dense K and V per layer for the whole
video, allocated up front: no window, no quantization):
- Quantize KV Cache: finished blocks are stored in INT2 (group 32, Hadamard rotation, FP8 scales:
  2.75 bits/element, 5.8x smaller than BF16);
- Jensen Bias Correction (taylor): removes the attention shift that quantized keys cause;
- AR Cache Window: which finished blocks stay cached (a block = one SamplerARVideo block).
KV Cache Report (the guider's MODEL + the sampler's output) gives what the cache cost after the run:
peak bytes, BF16 bytes, effective bits and the planner's figure for the same run. At cfg 1 the CFG
Guider runs the positive prompt only (one cache); raise cfg and the pack keeps a second cache for the
negative branch (core's own cache is allocated for the latent's batch and fails there)."""

_CORE_AR_SAMPLING = """Core's sampler (SamplerARVideo) denoises block by block: each step predicts x0 and re-noises it with
fresh noise (seed + 1000 x block + step), and the finished block runs once more at sigma 0 to write
it into the cache. Schedule: AR Video Schedule, preset self_forcing_4step:
t = 1000, 937.5, 833.3, 625 (Self-Forcing's and Causal Forcing's [1000, 750, 500, 250] warped with
shift 5; BasicScheduler simple, 4 steps on shift 5 gives the same sigmas)."""

_SELF_FORCING_CAUSAL_FILE = f"""- models/diffusion_models/{SELF_FORCING_CAUSAL}
  Self-Forcing (gdhe17/Self-Forcing, checkpoints/self_forcing_dmd.pt) as published: Load AR Video
  Checkpoint reads it with causal on (its EMA weights, as WAN21_CausalAR): no conversion step.
  Causal Forcing chunk-wise runs the same way: zhuhz22/Causal-Forcing chunkwise/causal_forcing.pt,
  weights generator (its reference samples the generator weights). (tools/convert_checkpoint.py
  self_forcing_dmd.pt self_forcing_dmd_causal.safetensors --causal makes a BF16 file for Load Diffusion
  Model once.)"""

_CAUSAL_FORCING_FRAMEWISE_FILE = f"""- models/diffusion_models/{CAUSAL_FORCING_FRAMEWISE}
  Causal Forcing frame-wise, the file ComfyUI's own Causal Forcing template loads (already marked causal):
  TalmajM/causal_forcing_framewise_ComfyUI_repackaged (split_files/diffusion_models). Or convert
  zhuhz22/Causal-Forcing framewise/causal_forcing.pt (its reference samples the EMA weights):
    python custom_nodes/comfyui-jensen-kv/tools/convert_checkpoint.py causal_forcing.pt \\
        models/diffusion_models/{CAUSAL_FORCING_FRAMEWISE} --key generator_ema --causal"""

NOTE_CORE_CHUNKWISE = f"""Self-Forcing / Causal Forcing chunk-wise on ComfyUI's own AR sampler: INT2 KV cache + Jensen

Wan 2.1 T2V 1.3B, chunk-wise causal: SamplerCustomAdvanced with SamplerARVideo, num_frame_per_block
3 (3 latent frames per block, as these checkpoints were trained), EmptyARVideoLatent 832x480,
81 frames = 21 latent frames = 7 blocks, CFG Guider at cfg 1, seed 42.
{_CORE_AR_SAMPLING}

{_CORE_AR_CACHE}
Window here: 0 keeps every block. 81 frames is the length these checkpoints were trained on, so each
block attends to all earlier ones, as in the reference. For longer videos (raise length) bound the
cache, e.g. window 6 + sink 1: the first block stays, then the last 6, and the cache stops growing.

{_CORE_AR_NEEDS}

{_COMMON_FILES}
{_SELF_FORCING_CAUSAL_FILE}"""

NOTE_CORE_FRAMEWISE = f"""Causal Forcing frame-wise on ComfyUI's own AR sampler: INT2 KV cache + Jensen

Wan 2.1 T2V 1.3B, frame-wise causal: SamplerCustomAdvanced with SamplerARVideo, num_frame_per_block
1 (one latent frame per block: the frame-wise checkpoints are trained that way; a chunk-wise
checkpoint needs 3), EmptyARVideoLatent 832x480, 81 frames = 21 latent frames = 21 blocks, CFG Guider
at cfg 1, seed 42. Frame-wise Causal Forcing moves more than the chunk-wise models (its authors:
"higher dynamic degree"); every frame is one more block in the cache.
{_CORE_AR_SAMPLING}

{_CORE_AR_CACHE}
Window here: 0 keeps every block (frame). 81 frames (21 latent frames) is the training length: each
frame attends to all earlier ones, as in the reference. For longer videos (raise length) bound the
cache, e.g. window 17 + sink 3: the first 3 frames stay, then the last 17 (20 frames of context).

{_CORE_AR_NEEDS}

{_COMMON_FILES}
{_CAUSAL_FORCING_FRAMEWISE_FILE}"""

NOTE_CORE_I2V = f"""Image to video with Causal Forcing frame-wise on ComfyUI's own AR sampler: INT2 KV cache + Jensen

Load Image (ComfyUI/input/{START_IMAGE}: put your image there, or upload another) -> ARVideoI2V:
it scales the image to 832x480, VAE-encodes it as latent frame 0 and hands it to the MODEL; its
LATENT output is the empty video (81 frames = 21 latent frames) for the sampler. Core runs the start
frame through the model once at sigma 0, which writes it into the cache; the pack caches it like any
block (here in INT2), and every later frame attends to it. The video starts with your image.
SamplerARVideo num_frame_per_block 1 (frame-wise: 20 blocks after the start frame), CFG Guider at
cfg 1, seed 42, as ComfyUI's own Causal Forcing I2V template samples it.
{_CORE_AR_SAMPLING}

Order: the pack's nodes come before ARVideoI2V, which clones the MODEL with everything they put on it
and adds the start frame; KV Cache Report takes ARVideoI2V's MODEL (the one the guider got).

{_CORE_AR_CACHE}
Window here: 0 keeps every block, the start frame included: the reference attends to it all along.
For longer videos, a sink of 1 keeps the start frame while the window moves on (e.g. window 19 +
sink 1).

{_CORE_AR_NEEDS}

{_COMMON_FILES}
{_CAUSAL_FORCING_FRAMEWISE_FILE}"""

NOTE_CORE_TINY = """Tiny AR on ComfyUI's own AR sampler - runs on a CPU, no download: the pack's tiny trained AR model, one seed through three caches

The tiny CPU demo again, sampled by ComfyUI's own AR sampler (SamplerCustomAdvanced + SamplerARVideo)
instead of the pack's Chunked AR Video Sampler. jensen-kv-tiny-ar is a 6M-parameter Wan 2.1 model
(2 heads x 128, 4 blocks) trained by this pack on synthetic latent videos: coloured balls that bounce
and occlude over a panning texture (custom_nodes/comfyui-jensen-kv/models/tiny_ar, bundled: Load
Diffusion Model lists it, nothing to download). Its file carries the causal flag, so ComfyUI v0.27+
loads it as a causal-AR Wan (WAN21_CausalAR). It knows six prompts (Tiny AR Prompt) and needs no text
encoder and no VAE (Tiny AR Decode maps its latents to colours). 128x128 pixels (16x16 latents),
93 frames = 24 latent frames = 8 blocks of 3 (SamplerARVideo 3), 8 steps (BasicScheduler simple on
shift 3), seed 42. Core re-noises after every step (the pack's demo integrates with euler), so the
videos are not that demo's.
AR Cache Window 3 (the model's training window: 3 finished blocks) in front of all three samplers:
  left   - full-precision cache: AR Cache Window alone (core's own cache has no window);
  middle - INT2 cache (group 32, Hadamard rotation): quantized keys steal attention;
  right  - INT2 + Jensen bias correction.
Saved side by side as an animated WEBP (jensen_kv/tiny_core_ab_*.webp); each KV Cache Report gives
its cache's bytes and bits. It runs in under a minute on 2 CPU cores. A proxy with learned attention -
not a substitute for Wan. Needs ComfyUI v0.27 or later (SamplerARVideo, EmptyARVideoLatent); on older
ComfyUI use the tiny AR CPU demo."""

NEGATIVE_WAN = (
    "色调艳丽，过曝，静态，细节模糊不清，字幕，风格，作品，画作，画面，静止，整体发灰，最差质量，低质量，JPEG压缩残留，"
    "丑陋的，残缺的，多余的手指，画得不好的手部，画得不好的脸部，畸形的，毁容的，形态畸形的肢体，手指融合，"
    "静止不动的画面，杂乱的背景，三条腿，背景人很多，倒着走"
)  # Wan's own negative prompt
PROMPT_I2V = "The scene comes alive: slow camera push-in, soft light drifting across the frame, gentle natural motion"
CORE_NOISE = {"noise_seed": 42, "control_after_generate": "fixed"}
CORE_WINDOW_ALL = {"window_chunks": 0, "sink_chunks": 0}


def _core_ar(kind: str) -> dict:
    """T2V chunk-wise ("chunkwise"), T2V frame-wise ("framewise") or I2V frame-wise ("i2v") on core's sampler."""
    i2v = kind == "i2v"
    unet = SELF_FORCING_CAUSAL if kind == "chunkwise" else CAUSAL_FORCING_FRAMEWISE
    block = 3 if kind == "chunkwise" else 1
    note = {"chunkwise": NOTE_CORE_CHUNKWISE, "framewise": NOTE_CORE_FRAMEWISE, "i2v": NOTE_CORE_I2V}[kind]
    block_title = {
        "chunkwise": "Sampler AR Video (3 latent frames per block)",
        "framewise": "Sampler AR Video (1 latent frame per block)",
        "i2v": "Sampler AR Video (1 latent frame per block)",
    }[kind]
    nodes = [
        _note(note, size=(600, 1040 if i2v else 940)),
        *_loaders(unet, shift=5.0, causal=kind == "chunkwise"),
        _n("pos", "CLIPTextEncode", 2, {"text": PROMPT_I2V if i2v else PROMPT}, title="Prompt", size=[400, 160]),
        _n(
            "neg",
            "CLIPTextEncode",
            2,
            {"text": NEGATIVE_WAN},
            title="Negative prompt (used above cfg 1)",
            size=[400, 130],
        ),
        *(
            [_n("image", "LoadImage", 2, {"image": START_IMAGE}, title="Start image (ComfyUI/input)")]
            if i2v
            else [_n("latent", "EmptyARVideoLatent", 2, {"width": 832, "height": 480, "length": 81, "batch_size": 1})]
        ),
        _n("noise", "RandomNoise", 2, CORE_NOISE),
        _n("select", "SamplerARVideo", 2, {"num_frame_per_block": block}, title=block_title),
        _n("sched", "JensenKVARSchedule", 2, SF_SCHEDULE, title="Self-Forcing schedule (t = 1000, 937.5, 833.3, 625)"),
        _n("quant", "JensenKVQuantizeKVCache", 3, QUANT_INT2),
        _n("jensen", "JensenKVBiasCorrection", 3, JENSEN_TAYLOR),
        _n("window", "JensenKVARCacheWindow", 3, CORE_WINDOW_ALL, title="AR Cache Window (0 = every block)"),
        *(
            [
                _n(
                    "i2v",
                    "ARVideoI2V",
                    3,
                    {"width": 832, "height": 480, "length": 81, "batch_size": 1},
                    title="ARVideoI2V (start frame -> cache)",
                )
            ]
            if i2v
            else []
        ),
        _n("guider", "CFGGuider", 4, {"cfg": 1.0}, title="CFG Guider (cfg 1)"),
        _n("sampler", "SamplerCustomAdvanced", 4, size=[300, 130]),
        _n("decode", "VAEDecode", 5),
        _save_webp(f"jensen_kv/core_ar_{kind}_int2_jensen", 16.0, 5),
        _n("report", "JensenKVCacheReport", 6, size=[360, 120]),
    ]
    model = "i2v" if i2v else "window"
    links = [
        ("unet", "MODEL", "shift", "model"),
        ("shift", "MODEL", "quant", "model"),
        ("quant", "MODEL", "jensen", "model"),
        ("jensen", "MODEL", "window", "model"),
        *(
            [
                ("window", "MODEL", "i2v", "model"),
                ("vae", "VAE", "i2v", "vae"),
                ("image", "IMAGE", "i2v", "start_image"),
            ]
            if i2v
            else []
        ),
        (model, "MODEL", "guider", "model"),
        ("clip", "CLIP", "pos", "clip"),
        ("clip", "CLIP", "neg", "clip"),
        ("pos", "CONDITIONING", "guider", "positive"),
        ("neg", "CONDITIONING", "guider", "negative"),
        ("noise", "NOISE", "sampler", "noise"),
        ("guider", "GUIDER", "sampler", "guider"),
        ("select", "SAMPLER", "sampler", "sampler"),
        ("sched", "SIGMAS", "sampler", "sigmas"),
        ("i2v" if i2v else "latent", "LATENT", "sampler", "latent_image"),
        ("sampler", "LATENT", "decode", "samples"),
        ("vae", "VAE", "decode", "vae"),
        ("decode", "IMAGE", "save", "images"),
        (model, "MODEL", "report", "model"),
        ("sampler", "LATENT", "report", "samples"),
    ]
    name = {
        "chunkwise": "13 Core AR sampler, chunk-wise",
        "framewise": "14 Core AR sampler, frame-wise",
        "i2v": "15 Core AR sampler, image to video",
    }[kind]
    return {"name": name, "nodes": nodes, "links": links, "groups": []}


def _core_ar_tiny_cpu_demo() -> dict:
    stitch = {"direction": "right", "match_image_size": True, "spacing_width": 4, "spacing_color": "white"}
    arms = (("fp", "A: full-precision cache"), ("int2", "B: INT2 cache"), ("jensen", "C: INT2 + Jensen"))
    nodes = [
        _note(NOTE_CORE_TINY, size=(540, 640)),
        _n("unet", "UNETLoader", 1, {"unet_name": TINY_AR, "weight_dtype": "default"}, size=[340, 90]),
        _n("shift", "ModelSamplingSD3", 1, {"shift": 3.0}),
        _n(
            "window",
            "JensenKVARCacheWindow",
            1,
            {"window_chunks": 3, "sink_chunks": 0},
            title="AR Cache Window (3 = its training window)",
        ),
        _n(
            "pos",
            "JensenKVTinyARPrompt",
            2,
            {"prompt": "three balls bouncing fast over a cool texture"},
            size=[380, 60],
        ),
        _n(
            "latent",
            "EmptyARVideoLatent",
            2,
            {"width": 128, "height": 128, "length": 93, "batch_size": 1},
            title="24 latent frames of 16x16",
        ),
        _n("noise", "RandomNoise", 2, CORE_NOISE),
        _n(
            "select",
            "SamplerARVideo",
            2,
            {"num_frame_per_block": 3},
            title="Sampler AR Video (3 latent frames per block)",
        ),
        _n("sched", "BasicScheduler", 2, {"scheduler": "simple", "steps": 8, "denoise": 1.0}),
    ]
    for i, (arm, title) in enumerate(arms):
        first = f"g_{arm}"
        if arm == "int2":
            nodes.append(_n("quant", "JensenKVQuantizeKVCache", 3, QUANT_INT2, below="r_fp"))
            first = "quant"
        elif arm == "jensen":
            nodes.append(_n("jensen", "JensenKVBiasCorrection", 3, JENSEN_TAYLOR, below="r_int2"))
            first = "jensen"
        nodes += [
            _n(f"g_{arm}", "BasicGuider", 4, title=f"{title[:2]} guider", align=None if i == 0 else first),
            _n(f"s_{arm}", "SamplerCustomAdvanced", 5, title=title, align=f"g_{arm}", size=[300, 130]),
            _n(f"d_{arm}", "JensenKVTinyARDecode", 6, {"scale": 8}, align=f"g_{arm}"),
            _n(f"r_{arm}", "JensenKVCacheReport", 6, title=f"{title[:2]} KV Cache Report", size=[320, 110]),
        ]
    nodes += [
        _n("stitch1", "ImageStitch", 7, stitch, title="A | B", align="g_int2"),
        _n("stitch2", "ImageStitch", 7, stitch, title="A | B | C"),
        _n(
            "save",
            "SaveAnimatedWEBP",
            8,
            {
                "filename_prefix": "jensen_kv/tiny_core_ab",
                "fps": 8.0,
                "lossless": True,
                "quality": 90,
                "method": "default",
            },
            align="g_int2",
            size=[420, 300],
        ),
    ]
    links = [
        ("unet", "MODEL", "shift", "model"),
        ("shift", "MODEL", "window", "model"),
        ("shift", "MODEL", "sched", "model"),
        ("window", "MODEL", "quant", "model"),
        ("quant", "MODEL", "jensen", "model"),
    ]
    for arm, model in (("fp", "window"), ("int2", "quant"), ("jensen", "jensen")):
        links += [
            (model, "MODEL", f"g_{arm}", "model"),
            ("pos", "CONDITIONING", f"g_{arm}", "conditioning"),
            ("noise", "NOISE", f"s_{arm}", "noise"),
            (f"g_{arm}", "GUIDER", f"s_{arm}", "guider"),
            ("select", "SAMPLER", f"s_{arm}", "sampler"),
            ("sched", "SIGMAS", f"s_{arm}", "sigmas"),
            ("latent", "LATENT", f"s_{arm}", "latent_image"),
            (f"s_{arm}", "LATENT", f"d_{arm}", "samples"),
            (model, "MODEL", f"r_{arm}", "model"),
            (f"s_{arm}", "LATENT", f"r_{arm}", "samples"),
        ]
    links += [
        ("d_fp", "IMAGE", "stitch1", "image1"),
        ("d_int2", "IMAGE", "stitch1", "image2"),
        ("stitch1", "IMAGE", "stitch2", "image1"),
        ("d_jensen", "IMAGE", "stitch2", "image2"),
        ("stitch2", "IMAGE", "save", "images"),
    ]
    groups = [
        {
            "title": "A: full-precision cache (AR Cache Window alone)",
            "members": ["g_fp", "s_fp", "d_fp", "r_fp"],
            "color": "#3f789e",
        },
        {"title": "B: INT2 cache", "members": ["quant", "g_int2", "s_int2", "d_int2", "r_int2"], "color": "#a1309b"},
        {
            "title": "C: INT2 + Jensen bias correction",
            "members": ["jensen", "g_jensen", "s_jensen", "d_jensen", "r_jensen"],
            "color": "#8A8",
        },
    ]
    return {
        "name": "02 Tiny AR, core sampler - runs on a CPU, no download",
        "nodes": nodes,
        "links": links,
        "groups": groups,
        "gap_y": 110,
    }


#: the workflows on ComfyUI's own AR sampler (v0.27+), built and tested apart from the others (see above)
CORE_WORKFLOWS: list[dict] = [_core_ar("chunkwise"), _core_ar("framewise"), _core_ar("i2v"), _core_ar_tiny_cpu_demo()]
CORE_WORKFLOW_NAMES = frozenset(spec["name"] for spec in CORE_WORKFLOWS)
WORKFLOWS += CORE_WORKFLOWS


# ============================================================================ HY-WorldPlay (ComfyUI v0.27+)
# HY-WorldPlay is built on ComfyUI's HunyuanVideo 1.5 (v0.27+: HunyuanVideo15ImageToVideo, DualCLIPLoader type
# hunyuan_video_15): build_workflows.py builds it with a ComfyUI that has HunyuanVideo 1.5, and its tests are marked
# hunyuan15 (tests/web/conftest.py marks the shared per-file tests too): deselected on v0.3.64, never skipped.
WORLDPLAY_UNET = "hy_worldplay_ar_distilled_action.safetensors"  # ar_distilled_action_model/model.safetensors
HY15_QWEN = "qwen_2.5_vl_7b_fp8_scaled.safetensors"
HY15_BYT5 = "byt5_small_glyphxl_fp16.safetensors"
HY15_VAE = "hunyuanvideo15_vae_fp16.safetensors"
SIGCLIP = "sigclip_vision_patch14_384.safetensors"
MODEL_FILES["diffusion_models"] = (*MODEL_FILES["diffusion_models"], WORLDPLAY_UNET)
MODEL_FILES["text_encoders"] = (*MODEL_FILES["text_encoders"], HY15_QWEN, HY15_BYT5)
MODEL_FILES["vae"] = (*MODEL_FILES["vae"], HY15_VAE)
MODEL_FILES["clip_vision"] = (SIGCLIP,)
WORLDPLAY_POSE = "w-15, right-8, w-8"  # 1 + 31 = 32 latent frames = 125 video frames
WORLDPLAY_PROMPT = "A sunlit stone courtyard with arches and potted olive trees, the camera walking through it"
WORLDPLAY_SAMPLER = {"seed": 42, "control_after_generate": "fixed"}

NOTE_WORLDPLAY = f"""HY-WorldPlay image to video at 480p along a camera path, with a 2-bit KV cache + Jensen bias correction

HY-WorldPlay (Tencent-Hunyuan/HY-WorldPlay): HunyuanVideo 1.5's 480p image-to-video transformer with an action
embedding and a second, camera-projective (PRoPE) attention stream, distilled to generate chunks of 4 latent
frames autoregressively in 4 steps. Load HY-WorldPlay builds it from ComfyUI's HunyuanVideo 1.5 classes
(UNETLoader would read the file as plain HunyuanVideo 1.5 and drop both additions).

The graph: your start image (Load Image; SigLIP features through CLIP Vision Encode) and prompt go through
HunyuanVideo15ImageToVideo (832x480; length = the trajectory's length output: 125 frames = 32 latent
frames = 8 chunks). HY-WorldPlay Trajectory turns the pose string "{WORLDPLAY_POSE}" into one camera pose
per latent frame (w/s forward/back, a/d left/right, left/right yaw, up/down pitch; the number is latent
frames); HY-WorldPlay Trajectory Preview draws it. HY-WorldPlay AR Sampler then does what the reference's
AR rollout does: before every chunk it rebuilds the cache from up to 20 context frames chosen by view
overlap (chunk 0, the older chunk whose views overlap the new one's most, the last 3 chunks), re-encoded
in one forward at t = 14 with RoPE positions renumbered 0..N-1; the chunk then sits at N..N+3 and is
denoised with Euler on AR Video Schedule worldplay_4step: t = 1000, 937.5, 833.3, 625 (shift 5), cfg 1.
The view-overlap points are drawn from the seed (the reference draws them unseeded), so a seed gives
one video.

The pack's nodes on the MODEL: Quantize KV Cache stores the context of both streams of all 54 blocks in
INT2 (group 32, Hadamard rotation, FP8 scales: 2.75 bits/element) and Jensen Bias Correction (taylor)
removes the attention the quantized keys steal. The prompt's keys and values stay in full precision
beside the cache. At 480p the cache holds 20 frames x 1,560 tokens x 108 layers: 27.6 GB in BF16 (the
reference's), 4.74 GB here (benchmarks/worldplay_memory.py); remove the two nodes for the full-precision
A/B baseline. The sampler's report gives the measured bytes and the context of every chunk.

Needs ComfyUI v0.27 or later (HunyuanVideo 1.5 in core).

Model files (put them under ComfyUI/models/, then press R to refresh the loaders):
- models/diffusion_models/{WORLDPLAY_UNET}
  tencent/HY-WorldPlay: ar_distilled_action_model/model.safetensors, renamed (BF16; weight_dtype fp8_e4m3fn
  halves it).
- models/text_encoders/{HY15_QWEN} and models/text_encoders/{HY15_BYT5}
  from Comfy-Org/HunyuanVideo_1.5_repackaged (split_files/text_encoders); DualCLIPLoader type
  "hunyuan_video_15".
- models/vae/{HY15_VAE}
  from Comfy-Org/HunyuanVideo_1.5_repackaged (split_files/vae).
- models/clip_vision/{SIGCLIP}
  from Comfy-Org/HunyuanVideo_1.5_repackaged (split_files/clip_vision).
Start image: ComfyUI/input/{START_IMAGE} (put your image there, or upload another)."""


def _worldplay_i2v() -> dict:
    nodes = [
        _note(NOTE_WORLDPLAY, size=(620, 1080)),
        _n(
            "unet", "JensenKVLoadWorldPlay", 1, {"unet_name": WORLDPLAY_UNET, "weight_dtype": "default"}, size=[380, 90]
        ),
        _n(
            "clip",
            "DualCLIPLoader",
            1,
            {"clip_name1": HY15_QWEN, "clip_name2": HY15_BYT5, "type": "hunyuan_video_15", "device": "default"},
            size=[380, 130],
        ),
        _n("vae", "VAELoader", 1, {"vae_name": HY15_VAE}, size=[380, 60]),
        _n("clipvision", "CLIPVisionLoader", 1, {"clip_name": SIGCLIP}, size=[380, 60]),
        _n("image", "LoadImage", 1, {"image": START_IMAGE}, title="Start image (ComfyUI/input)"),
        _n("pos", "CLIPTextEncode", 2, {"text": WORLDPLAY_PROMPT}, title="Prompt", size=[400, 160]),
        _n("neg", "CLIPTextEncode", 2, {"text": ""}, title="Negative prompt (unused: cfg 1)", size=[400, 100]),
        _n("encode", "CLIPVisionEncode", 2, {"crop": "center"}),
        _n(
            "path",
            "JensenKVWorldPlayTrajectory",
            2,
            {"pose": WORLDPLAY_POSE, "latents": 0},
            title="HY-WorldPlay Trajectory (32 latent frames)",
            size=[400, 150],
        ),
        _n("i2v", "HunyuanVideo15ImageToVideo", 3, {"width": 832, "height": 480, "length": 125, "batch_size": 1}),
        _n("preview_path", "JensenKVWorldPlayTrajectoryPreview", 3, {"size": 384}),
        _n("show_path", "PreviewImage", 3, size=[300, 300]),
        _n("quant", "JensenKVQuantizeKVCache", 4, QUANT_INT2),
        _n("jensen", "JensenKVBiasCorrection", 4, JENSEN_TAYLOR),
        _n("select", "KSamplerSelect", 4, {"sampler_name": "euler"}),
        _n(
            "sched",
            "JensenKVARSchedule",
            4,
            {**SF_SCHEDULE, "preset": "worldplay_4step"},
            title="HY-WorldPlay schedule (t = 1000, 937.5, 833.3, 625)",
        ),
        _n("sampler", "JensenKVWorldPlayARSampler", 5, WORLDPLAY_SAMPLER, size=[360, 200]),
        _n("decode", "VAEDecode", 6),
        _save_webp("jensen_kv/worldplay_i2v_int2_jensen", 24.0, 6),
    ]
    links = [
        ("unet", "MODEL", "quant", "model"),
        ("quant", "MODEL", "jensen", "model"),
        ("jensen", "MODEL", "sampler", "model"),
        ("clip", "CLIP", "pos", "clip"),
        ("clip", "CLIP", "neg", "clip"),
        ("clipvision", "CLIP_VISION", "encode", "clip_vision"),
        ("image", "IMAGE", "encode", "image"),
        ("pos", "CONDITIONING", "i2v", "positive"),
        ("neg", "CONDITIONING", "i2v", "negative"),
        ("vae", "VAE", "i2v", "vae"),
        ("image", "IMAGE", "i2v", "start_image"),
        ("encode", "CLIP_VISION_OUTPUT", "i2v", "clip_vision_output"),
        ("path", "length", "i2v", "length"),
        ("path", "trajectory", "preview_path", "trajectory"),
        ("preview_path", "IMAGE", "show_path", "images"),
        ("i2v", "positive", "sampler", "positive"),
        ("i2v", "latent", "sampler", "latent"),
        ("path", "trajectory", "sampler", "trajectory"),
        ("select", "SAMPLER", "sampler", "sampler"),
        ("sched", "SIGMAS", "sampler", "sigmas"),
        ("sampler", "LATENT", "decode", "samples"),
        ("vae", "VAE", "decode", "vae"),
        ("decode", "IMAGE", "save", "images"),
    ]
    return {"name": "12 HY-WorldPlay image to video", "nodes": nodes, "links": links, "groups": []}


#: the workflows on ComfyUI's HunyuanVideo 1.5 (v0.27+), built and tested apart from the others (see above)
WORLDPLAY_WORKFLOWS: list[dict] = [_worldplay_i2v()]
WORLDPLAY_WORKFLOW_NAMES = frozenset(spec["name"] for spec in WORLDPLAY_WORKFLOWS)
WORKFLOWS += WORLDPLAY_WORKFLOWS


# ============================================================================ LingBot-World 2.0 (every ComfyUI)
# LingBot-World 2.0 is Wan 2.1's stack with camera layers (runtime/families/lingbot): WanImageToVideo, CLIPLoader
# "wan" and Wan 2.1's VAE exist on every supported ComfyUI, so it is built with the oldest, as the Wan workflows.
#: the release as huggingface-cli downloads it (robbyant/lingbot-world-v2-1.3b-causal-fast): Load LingBot-World lists its
#: transformers/ folder (config.json, the index and the shards) as a folder and reads it as it is
LINGBOT_REPO = "lingbot-world-v2-1.3b-causal-fast"
LINGBOT_UNET = f"{LINGBOT_REPO}/transformers/"


def write_lingbot_release_placeholder(diffusion_models) -> None:
    """A folder shaped like the release (config.json, an index naming LingBot's tensors, empty shards), so Load
    LingBot-World lists :data:`LINGBOT_UNET` (the listing reads the index alone)."""
    import json
    from pathlib import Path

    folder = Path(diffusion_models) / LINGBOT_UNET
    folder.mkdir(parents=True, exist_ok=True)
    shard = "diffusion_pytorch_model-00001-of-00001.safetensors"
    (folder / shard).touch()
    names = ("head.modulation", "patch_embedding_wancamctrl.weight")
    (folder / "diffusion_pytorch_model.safetensors.index.json").write_text(
        json.dumps({"weight_map": dict.fromkeys(names, shard)})
    )
    (folder / "config.json").write_text(json.dumps({"_class_name": "WanModelFast", "num_heads": 12}))


LINGBOT_PATH = "w-15, w+right-8, w-8"  # 1 + 31 = 32 latent frames = 125 video frames = 8 chunks of 4
LINGBOT_PROMPT = "A sunlit stone courtyard with arches and potted olive trees, the camera walking through it"
LINGBOT_SAMPLER = {
    "seed": 42,
    "control_after_generate": "fixed",
    "local_attn_size": 18,
    "sink_size": 6,
    "chunk_frames": 4,
    "timestep_indices": "0,250,500,750",
    "shift": 10.0,
}

NOTE_LINGBOT = f"""LingBot-World 2.0 image to video at 480p along a camera path, with a 2-bit KV cache + Jensen bias correction

LingBot-World 2.0 (Robbyant, causal-fast 1.3B): Wan 2.1's blocks with 36 input channels (noise, mask, image
latent) and camera layers that fold a per-pixel ray map of the camera path into every token, distilled to make
chunks of 4 latent frames in 4 steps without CFG. Load LingBot-World builds it from ComfyUI's Wan 2.1 classes
(UNETLoader would read the file as plain Wan 2.1 and drop the camera layers: patch_embedding_wancamctrl,
c2ws_hidden_states_layer1/2 and every block's cam_injector_layer1/2, cam_scale_layer, cam_shift_layer).

The graph: your start image and prompt go through WanImageToVideo (832x480; length = the camera's length
output: 125 frames = 32 latent frames = 8 chunks). LingBot-World Camera turns "{LINGBOT_PATH}" into one camera
pose per latent frame (w/s forward/back, a/d right/left on the ground plane, left/right yaw 6 deg, up/down pitch
4 deg; + holds keys together; the number is latent frames), or reads the reference's pose folder (poses.npy,
intrinsics.npy) from pose_folder. LingBot-World 2.0 takes no action labels. LingBot-World AR Sampler does what the
reference's causal-fast run does: every chunk denoised in 4 DMD steps at t = 999, 967, 908, 768 (shift 10, no
CFG, fresh noise between steps), then written to the cache by one clean pass at t = 0; the window is the
reference's 18 latent frames with a sink of 6 (kept as cache entries of 2 frames).

The pack's nodes on the MODEL: Quantize KV Cache stores the cache of all 30 blocks in INT2 (group 32, Hadamard
rotation, FP8 scales: 2.75 bits/element) and Jensen Bias Correction (taylor) removes the attention the quantized
keys steal. At 480x832 the window's 14 cached frames (plus the 4 being made) cost 4.03 GB in BF16 and 0.69 GB
here (the 14B: 17.89 GB and 3.08 GB; docs/lingbot.md); remove the two nodes for the full-precision A/B baseline.

Model files (put them under ComfyUI/models/, then press R to refresh the loaders):
- models/diffusion_models/{LINGBOT_UNET}
  the release as published, no merging: from ComfyUI's folder,
    huggingface-cli download robbyant/{LINGBOT_REPO} --local-dir models/diffusion_models/{LINGBOT_REPO}
  (the README's command, for the 1.3B; Load LingBot-World lists its transformers/ folder, config.json and the
  safetensors shards, and reads it as it is. A folder has no single download link, so the Missing
  Models list cannot offer it.)
- models/text_encoders/{TEXT_ENCODER}
  from Comfy-Org/Wan_2.1_ComfyUI_repackaged (split_files/text_encoders); CLIPLoader type "wan".
- models/vae/{VAE}
  from Comfy-Org/Wan_2.1_ComfyUI_repackaged (split_files/vae).
Start image: ComfyUI/input/{START_IMAGE} (put your image there, or upload another)."""


def _lingbot_i2v() -> dict:
    nodes = [
        _note(NOTE_LINGBOT, size=(620, 1000)),
        _n("unet", "JensenKVLoadLingBot", 1, {"unet_name": LINGBOT_UNET, "weight_dtype": "default"}, size=[380, 90]),
        _n("clip", "CLIPLoader", 1, {"clip_name": TEXT_ENCODER, "type": "wan", "device": "default"}, size=[340, 110]),
        _n("vae", "VAELoader", 1, {"vae_name": VAE}, size=[340, 60]),
        _n("image", "LoadImage", 1, {"image": START_IMAGE}, title="Start image (ComfyUI/input)"),
        _n("pos", "CLIPTextEncode", 2, {"text": LINGBOT_PROMPT}, title="Prompt", size=[400, 160]),
        _n("neg", "CLIPTextEncode", 2, {"text": ""}, title="Negative prompt (unused: no CFG)", size=[400, 100]),
        _n(
            "camera",
            "JensenKVLingBotCamera",
            2,
            {"path": LINGBOT_PATH, "pose_folder": ""},
            title="LingBot-World Camera (32 latent frames)",
            size=[400, 150],
        ),
        _n("i2v", "WanImageToVideo", 3, {"width": 832, "height": 480, "length": 125, "batch_size": 1}),
        _n("quant", "JensenKVQuantizeKVCache", 4, QUANT_INT2),
        _n("jensen", "JensenKVBiasCorrection", 4, JENSEN_TAYLOR),
        _n("sampler", "JensenKVLingBotARSampler", 5, LINGBOT_SAMPLER, size=[360, 260]),
        _n("decode", "VAEDecode", 6),
        _save_webp("jensen_kv/lingbot_world_i2v_int2_jensen", 16.0, 6),
    ]
    links = [
        ("unet", "MODEL", "quant", "model"),
        ("quant", "MODEL", "jensen", "model"),
        ("jensen", "MODEL", "sampler", "model"),
        ("clip", "CLIP", "pos", "clip"),
        ("clip", "CLIP", "neg", "clip"),
        ("pos", "CONDITIONING", "i2v", "positive"),
        ("neg", "CONDITIONING", "i2v", "negative"),
        ("vae", "VAE", "i2v", "vae"),
        ("image", "IMAGE", "i2v", "start_image"),
        ("camera", "length", "i2v", "length"),
        ("i2v", "positive", "sampler", "positive"),
        ("i2v", "latent", "sampler", "latent"),
        ("camera", "camera", "sampler", "camera"),
        ("sampler", "LATENT", "decode", "samples"),
        ("vae", "VAE", "decode", "vae"),
        ("decode", "IMAGE", "save", "images"),
    ]
    return {"name": "11 LingBot-World image to video", "nodes": nodes, "links": links, "groups": []}


LINGBOT_WORKFLOWS: list[dict] = [_lingbot_i2v()]
WORKFLOWS += LINGBOT_WORKFLOWS

# ------------------------------------------------------------------------------------------ model entries
# What ComfyUI's missing-models dialog offers: ``properties.models`` on each loader node, as core's templates carry
# them ({"name", "url", "directory"}). One entry per model file a workflow names, written by build_workflows.py
# (add_model_entries) and checked by test_workflows.py. The URL is the public file where a file is used as it is
# published; where the pack's converter must run first (the Note says how), it is the repository page of the file
# to convert (no ready file is published: downloading it as it is would give a file no loader reads).
_COMFY_WAN = "https://huggingface.co/Comfy-Org/Wan_2.1_ComfyUI_repackaged/resolve/main/split_files"
_MAGI1_DISTILL = "https://huggingface.co/sand-ai/MAGI-1/resolve/main/ckpt/magi/4.5B_distill/inference_weight.distill"
_COMFY_HY15 = "https://huggingface.co/Comfy-Org/HunyuanVideo_1.5_repackaged/resolve/main/split_files"
#: file name -> (ComfyUI folder, URL, ready as published (True) or to convert with tools/convert_checkpoint.py)
MODEL_SOURCES: dict[str, tuple[str, str, bool]] = {
    TEXT_ENCODER: ("text_encoders", f"{_COMFY_WAN}/text_encoders/{TEXT_ENCODER}", True),
    VAE: ("vae", f"{_COMFY_WAN}/vae/{VAE}", True),
    T5_XXL: ("text_encoders", f"https://huggingface.co/comfyanonymous/flux_text_encoders/resolve/main/{T5_XXL}", True),
    SKYREELS_DF: (
        "diffusion_models",
        f"https://huggingface.co/Kijai/WanVideo_comfy/resolve/main/Skyreels/{SKYREELS_DF}",
        True,
    ),
    CAUSAL_FORCING_FRAMEWISE: (
        "diffusion_models",
        "https://huggingface.co/TalmajM/causal_forcing_framewise_ComfyUI_repackaged/resolve/main/split_files/"
        f"diffusion_models/{CAUSAL_FORCING_FRAMEWISE}",  # the URL ComfyUI's own Causal Forcing template names
        True,
    ),
    HY15_QWEN: ("text_encoders", f"{_COMFY_HY15}/text_encoders/{HY15_QWEN}", True),
    HY15_BYT5: ("text_encoders", f"{_COMFY_HY15}/text_encoders/{HY15_BYT5}", True),
    HY15_VAE: ("vae", f"{_COMFY_HY15}/vae/{HY15_VAE}", True),
    SIGCLIP: ("clip_vision", f"{_COMFY_HY15}/clip_vision/{SIGCLIP}", True),
    # published under another name (ar_distilled_action_model/model.safetensors): saved under this one, it loads
    WORLDPLAY_UNET: (
        "diffusion_models",
        "https://huggingface.co/tencent/HY-WorldPlay/resolve/main/ar_distilled_action_model/model.safetensors",
        True,
    ),
    # the training checkpoints as published, read by Load AR Video Checkpoint (paths from the authors' READMEs,
    # download commands and inference scripts; docs/checkpoints.md)
    SELF_FORCING: (
        "diffusion_models",
        "https://huggingface.co/gdhe17/Self-Forcing/resolve/main/checkpoints/self_forcing_dmd.pt",
        True,
    ),
    # published under another name (autoregressive_checkpoint/model.pt): saved under this one, it loads
    CAUSVID: (
        "diffusion_models",
        "https://huggingface.co/tianweiy/CausVid/resolve/main/autoregressive_checkpoint/model.pt",
        True,
    ),
    LONGLIVE: (
        "diffusion_models",
        "https://huggingface.co/Efficient-Large-Model/LongLive-1.3B/resolve/main/models/longlive_base.pt",
        True,
    ),
    # published under another name (models/lora.pt): saved under this one beside the base, it loads
    LONGLIVE_LORA: (
        "diffusion_models",
        "https://huggingface.co/Efficient-Large-Model/LongLive-1.3B/resolve/main/models/lora.pt",
        True,
    ),
    KREA: (
        "diffusion_models",
        f"https://huggingface.co/daydreamlive/krea-realtime-video/resolve/main/{KREA}",  # what scope downloads
        True,
    ),
    # published under another name (causal-forcing++/framewise-2step.pt): saved under this one, it loads
    CAUSAL_FORCING: (
        "diffusion_models",
        "https://huggingface.co/zhuhz22/Causal-Forcing/resolve/main/causal-forcing%2B%2B/framewise-2step.pt",
        True,
    ),
    # the shards as published (what diffusers' MAGI-1 conversion script downloads), saved under the names above
    MAGI1_DISTILL: ("diffusion_models", f"{_MAGI1_DISTILL}/model-00001-of-00002.safetensors", True),
    MAGI1_DISTILL_2: ("diffusion_models", f"{_MAGI1_DISTILL}/model-00002-of-00002.safetensors", True),
    # published as ckpt/vae/diffusion_pytorch_model.safetensors (what diffusers' MAGI-1 conversion script downloads):
    # saved under this name, Load MAGI-1 VAE reads it as it is (tests/test_magi1_model.py)
    MAGI1_VAE: (
        "vae",
        "https://huggingface.co/sand-ai/MAGI-1/resolve/main/ckpt/vae/diffusion_pytorch_model.safetensors",
        True,
    ),
}
#: the model loaders the workflows use: node type -> {widget: the ComfyUI folder it lists}
MODEL_LOADERS: dict[str, dict[str, str]] = {
    "UNETLoader": {"unet_name": "diffusion_models"},
    "CLIPLoader": {"clip_name": "text_encoders"},
    "DualCLIPLoader": {"clip_name1": "text_encoders", "clip_name2": "text_encoders"},
    "VAELoader": {"vae_name": "vae"},
    "CLIPVisionLoader": {"clip_name": "clip_vision"},
    "JensenKVLoadMagi1": {"model_name": "diffusion_models"},
    "JensenKVLoadMagi1VAE": {"vae_name": "vae"},
    "JensenKVLoadWorldPlay": {"unet_name": "diffusion_models"},
    # its first two widgets; LongLive's LoRA sits beside its base (lora_name "none" names no file)
    "JensenKVLoadARCheckpoint": {"ckpt_name": "diffusion_models", "lora_name": "diffusion_models"},
}


#: a file a widget names -> the files loaded with it that no widget names (a checkpoint's other shards): their entries
#: go on the same node, for the record (the front ends list only the entries a widget names; the Note and the
#: loader's message name the other shards)
COMPANIONS: dict[str, tuple[str, ...]] = {MAGI1_DISTILL: (MAGI1_DISTILL_2,)}


def model_entries(node: dict) -> list[dict]:
    """The ``properties.models`` of a UI-format node: one entry per model file its widgets name that is downloaded
    as published (bundled files need none: they ship with the pack; files to convert get none)."""
    names = [v for v in node.get("widgets_values") or [] if isinstance(v, str) and v in MODEL_SOURCES]
    names += [c for n in names for c in COMPANIONS.get(n, ())]  # the other shards of a set the widget names
    # a file to convert first has no entry: its URL would be a repository page, which the front end's download
    # would save under the model's name; the workflow's Note says how to make it (tools/convert_checkpoint.py)
    return [
        {"name": n, "url": MODEL_SOURCES[n][1], "directory": MODEL_SOURCES[n][0]} for n in names if MODEL_SOURCES[n][2]
    ]


def add_model_entries(workflow: dict) -> dict:
    """Put :func:`model_entries` on every node that names a model file (what build_workflows.py saves)."""
    for node in workflow.get("nodes", []):
        entries = model_entries(node)
        if entries:
            node.setdefault("properties", {})["models"] = entries
        elif isinstance(node.get("properties"), dict):
            node["properties"].pop("models", None)
    return workflow
