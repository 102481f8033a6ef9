"""MAGI-1's nodes: Load MAGI-1 Model, Load MAGI-1 VAE, MAGI-1 Text Encode, MAGI-1 VAE Decode and MAGI-1 AR Sampler
(the family's package: ``runtime/families/magi1/``)."""

from __future__ import annotations

import math

from comfy_api.latest import io

from ..runtime.families.magi1.comfy_model import CHUNK_FRAMES, VARIANTS, WEIGHT_DTYPES, load_magi1
from ..runtime.families.magi1.family import GEOMETRY
from ..runtime.families.magi1.files import choices, resolve, version
from ..runtime.families.magi1.model.checkpoint import CheckpointError
from ..runtime.families.magi1.recipe import Magi1Request, report_text, run
from ..runtime.families.magi1.text import encode
from ..runtime.families.magi1.vae import VAE_DTYPES, load_magi1_vae
from ..runtime.families.magi1.window import DEFAULT_STEPS, parse_kv_ranges
from .common import CATEGORY, UI_REPORT_KEY, Combo, JensenKVReport, advanced, logger, without_bundled

MAGI1_CATEGORY = f"{CATEGORY}/MAGI-1"
Magi1VAEType = io.Custom("MAGI1_VAE")
NONE_FOUND = "(no MAGI-1 checkpoint in models/diffusion_models)"
NO_VAE_FOUND = "(no MAGI-1 VAE in models/vae)"


def _check_listed(name, kind: str, none_found: str, what: str) -> bool | str:
    """A loader's ``validate_inputs``: its file or folder is one ComfyUI's ``kind`` folders hold."""
    if name is None:
        return True
    if name == none_found or name not in without_bundled(choices(kind), kind):
        shown = "nothing is there" if name == none_found else f"{name!r} is not there"
        return f"{shown}: put {what} (or a converted .safetensors) into ComfyUI's models/{kind} and press R"
    return True


class JensenKVLoadMagi1(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        names = without_bundled(choices("diffusion_models"))
        return io.Schema(
            node_id="JensenKVLoadMagi1",
            display_name="Load MAGI-1 Model",
            category=MAGI1_CATEGORY,
            description=(
                "Load Sand AI's MAGI-1 (4.5B or 24B, base or distill) as a MODEL: Sand AI's shards as published, saved "
                "side by side as <name>-0000k-of-0000N.safetensors (listed as the first), Sand AI's folder with "
                "model.safetensors.index.json and its shards, or a .safetensors file (e.g. made by "
                "tools/convert_checkpoint.py --magi1). The caption's special tokens come from the file, else from "
                "Sand AI's special_tokens.npz beside it. Refused with the reason: other models, .zst shards "
                "(decompress them first) and the distill_quant fp8 weights (use the distill weights with weight_dtype "
                "fp8_e4m3fn)."
            ),
            inputs=[
                Combo(
                    "model_name",
                    options=names or [NONE_FOUND],
                    tooltip="A file, the first of shards saved side by side, or a folder (ending in /) holding an "
                    "index and its shards, under models/diffusion_models.",
                ),
                Combo(
                    "weight_dtype",
                    options=list(WEIGHT_DTYPES),
                    default="default",
                    tooltip="How the weights are stored in memory: default (as ComfyUI picks), fp8_e4m3fn (half of bf16) or bf16.",
                ),
                Combo(
                    "variant",
                    options=list(VARIANTS),
                    default="auto",
                    tooltip="base (64 steps, cfg 3) or distill (fewer steps, cfg 1): they run different pipelines. auto "
                    "reads the file's metadata, else 'base' or 'distill' in its path, and refuses when neither says.",
                ),
            ],
            outputs=[io.Model.Output(tooltip="The MAGI-1 DiT; sample it with MAGI-1's chunk sampler.")],
        )

    @classmethod
    def validate_inputs(cls, model_name):
        # only model_name: ComfyUI attaches a failure to every input named here, so one missing file is one error
        # (weight_dtype and variant are plain dropdowns that ComfyUI checks itself)
        return _check_listed(model_name, "diffusion_models", NONE_FOUND, "Sand AI's inference_weight folder")

    @classmethod
    def fingerprint_inputs(cls, model_name, weight_dtype, variant):
        try:
            return f"{version(resolve(model_name))}|{weight_dtype}|{variant}"
        except (ValueError, OSError):
            return model_name

    @classmethod
    def execute(cls, model_name, weight_dtype="default", variant="auto") -> io.NodeOutput:
        if model_name == NONE_FOUND:
            raise ValueError(
                "Load MAGI-1 Model: no MAGI-1 checkpoint in models/diffusion_models. Put Sand AI's "
                "inference_weight folder there, or a file from tools/convert_checkpoint.py --magi1"
            )
        path = resolve(model_name, "diffusion_models")
        try:
            return io.NodeOutput(load_magi1(path, weight_dtype, variant))
        except CheckpointError as exc:
            raise ValueError(f"Load MAGI-1 Model: {exc}") from None


class JensenKVLoadMagi1VAE(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        names = choices("vae")
        return io.Schema(
            node_id="JensenKVLoadMagi1VAE",
            display_name="Load MAGI-1 VAE",
            category=MAGI1_CATEGORY,
            description=(
                "Load MAGI-1's ViT VAE decoder (8 x 8 pixels and 4 frames per latent pixel, 16 channels): Sand AI's "
                "ckpt/vae folder (config.json + diffusion_pytorch_model.safetensors) or one file from "
                "tools/convert_checkpoint.py --magi1-vae. Decodes with MAGI-1 VAE Decode."
            ),
            inputs=[
                Combo(
                    "vae_name",
                    options=names or [NO_VAE_FOUND],
                    tooltip="A file, or a folder (ending in /) with config.json, under models/vae.",
                ),
                Combo(
                    "dtype",
                    options=list(VAE_DTYPES),
                    default="auto",
                    tooltip="Weights and compute: auto (bf16 where the device has it, as the reference), bf16 or fp32.",
                ),
            ],
            outputs=[Magi1VAEType.Output(display_name="magi1_vae", tooltip="The decoder, for MAGI-1 VAE Decode.")],
        )

    @classmethod
    def validate_inputs(cls, vae_name):
        return _check_listed(vae_name, "vae", NO_VAE_FOUND, "Sand AI's ckpt/vae folder")

    @classmethod
    def fingerprint_inputs(cls, vae_name, dtype):
        try:
            return f"{version(resolve(vae_name, 'vae'))}|{dtype}"
        except (ValueError, OSError):
            return vae_name

    @classmethod
    def execute(cls, vae_name, dtype="auto") -> io.NodeOutput:
        if vae_name == NO_VAE_FOUND:
            raise ValueError("Load MAGI-1 VAE: no MAGI-1 VAE in models/vae; put Sand AI's ckpt/vae folder there")
        try:
            return io.NodeOutput(load_magi1_vae(resolve(vae_name, "vae"), dtype))
        except CheckpointError as exc:
            raise ValueError(f"Load MAGI-1 VAE: {exc}") from None


class JensenKVMagi1TextEncode(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="JensenKVMagi1TextEncode",
            display_name="MAGI-1 Text Encode",
            category=MAGI1_CATEGORY,
            description=(
                "Encode a prompt for MAGI-1 with T5-XXL: load t5xxl with CLIPLoader type 'pixart' (no padding). The "
                "prompt is lower-cased as MAGI-1's own prompt cleaning does and cut at 800 tokens; the HQ and "
                "DURATION special tokens are put in front of it per chunk by the MAGI-1 sampler."
            ),
            inputs=[
                io.Clip.Input("clip", tooltip="T5-XXL loaded with CLIPLoader, type pixart."),
                io.String.Input("text", multiline=True, dynamic_prompts=True, tooltip="The prompt."),
                io.Boolean.Input(
                    "clean",
                    default=True,
                    tooltip="Lower-case and collapse whitespace, as MAGI-1's own prompt cleaning does.",
                ),
            ],
            outputs=[io.Conditioning.Output(tooltip="The prompt's T5 embeddings (valid tokens only).")],
        )

    @classmethod
    def execute(cls, clip, text, clean=True) -> io.NodeOutput:
        return io.NodeOutput(encode(clip, text, bool(clean)))


class JensenKVMagi1VAEDecode(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="JensenKVMagi1VAEDecode",
            display_name="MAGI-1 VAE Decode",
            category=MAGI1_CATEGORY,
            description=(
                "Decode a MAGI-1 LATENT (16 channels) into frames: 4 per latent frame, 8 x 8 pixels per latent "
                "pixel, in tiles as Sand AI's pipeline decodes (256 px with a quarter overlap, 12 frames each)."
            ),
            inputs=[
                Magi1VAEType.Input("magi1_vae", tooltip="From Load MAGI-1 VAE."),
                io.Latent.Input("samples", tooltip="A MAGI-1 video LATENT (batch, 16, frames, height, width)."),
                advanced(
                    io.Int.Input(
                        "tile_pixels",
                        default=256,
                        min=64,
                        max=4096,
                        step=8,
                        tooltip="Tile side in pixels (256: the reference).",
                    )
                ),
                advanced(
                    io.Int.Input(
                        "tile_frames",
                        default=12,
                        min=4,
                        max=240,
                        step=4,
                        tooltip="Frames per tile (12: the reference at 24 fps).",
                    )
                ),
                advanced(
                    io.Float.Input(
                        "overlap",
                        default=0.25,
                        min=0.0,
                        max=0.75,
                        step=0.05,
                        tooltip="Spatial tile overlap, blended linearly (0.25: the reference).",
                    )
                ),
            ],
            outputs=[io.Image.Output(tooltip="The frames of every video in the batch, in order.")],
        )

    @classmethod
    def execute(cls, magi1_vae, samples, tile_pixels=256, tile_frames=12, overlap=0.25) -> io.NodeOutput:
        import comfy.model_management
        import comfy.utils

        bar = {}

        def progress(done, total):
            comfy.model_management.throw_exception_if_processing_interrupted()
            if "bar" not in bar:
                bar["bar"] = comfy.utils.ProgressBar(total)
            bar["bar"].update_absolute(done, total)

        images = magi1_vae.decode(samples["samples"], int(tile_pixels), int(tile_frames), float(overlap), progress)
        return io.NodeOutput(images)


CFG_CHOICES = ("auto", "1", "3")
DESCRIPTION = (
    "Sample MAGI-1 (Load MAGI-1 Model) as Sand AI's pipeline does: chunks of 24 frames, up to window_size chunks "
    "denoised together at their own noise levels, each reading a few chunks back (kv_ranges). Finished chunks are "
    "kept in the pack's KV cache (Quantize KV Cache / Jensen Bias Correction on the MODEL; full precision without "
    "them: the A/B baseline); the chunks still in flight are attended in full precision. Text to video; decode with "
    "MAGI-1 VAE Decode."
)


class JensenKVMagi1ARSampler(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="JensenKVMagi1ARSampler",
            display_name="MAGI-1 AR Sampler",
            category=MAGI1_CATEGORY,
            description=DESCRIPTION,
            inputs=[
                io.Model.Input(
                    "model", tooltip="MAGI-1 from Load MAGI-1 Model, optionally through Quantize KV Cache and Jensen."
                ),
                io.Conditioning.Input(
                    "positive",
                    tooltip="MAGI-1 Text Encode's prompt, or a Prompt Schedule of them (a prompt per chunk of 24 frames).",
                ),
                io.Int.Input("width", default=720, min=16, max=4096, step=16, tooltip="Video width in pixels."),
                io.Int.Input("height", default=720, min=16, max=4096, step=16, tooltip="Video height in pixels."),
                io.Int.Input(
                    "frames",
                    default=96,
                    min=4,
                    max=4096,
                    step=4,
                    tooltip="Video frames (4 per latent frame); rounded up to whole chunks of 24 frames.",
                ),
                io.Int.Input(
                    "seed",
                    default=1234,
                    min=0,
                    max=0xFFFFFFFFFFFFFFFF,
                    control_after_generate=True,
                    tooltip="Noise seed (the reference's default is 1234).",
                ),
                io.Int.Input(
                    "steps",
                    default=DEFAULT_STEPS,
                    min=1,
                    max=1000,
                    tooltip="Steps per chunk: 16 (paper, 24B distill), 64 (4.5B configs). A multiple of window_size and 4.",
                ),
                io.Int.Input(
                    "window_size",
                    default=4,
                    min=1,
                    max=4,
                    tooltip="Chunks denoised together (4: the reference). Fewer: slower, each query reads more cached chunks.",
                ),
                Combo(
                    "cfg",
                    options=list(CFG_CHOICES),
                    default="auto",
                    tooltip="Passes per step: 1 (distill), 3 (base: text, context, unconditional); auto: the model's.",
                ),
                advanced(
                    io.String.Input(
                        "kv_ranges",
                        default="5,4,3,2",
                        tooltip="Chunks a query reaches back (itself included), per quarter of its steps; 'all': every "
                        "earlier chunk (a long cached context, more memory).",
                    )
                ),
                advanced(
                    io.Int.Input(
                        "window_chunks",
                        default=0,
                        min=0,
                        max=4096,
                        tooltip="Finished chunks the cache keeps per layer; 0 = auto: as many as kv_ranges reach.",
                    )
                ),
                advanced(
                    io.Int.Input(
                        "sink_chunks",
                        default=0,
                        min=0,
                        max=4096,
                        tooltip="First chunks kept for good besides the window (with kv_ranges 'all').",
                    )
                ),
                advanced(
                    io.Boolean.Input(
                        "special_tokens",
                        default=True,
                        tooltip="Put the HQ and DURATION tokens in front of each chunk's caption (the reference's).",
                    )
                ),
            ],
            outputs=[
                io.Latent.Output(
                    display_name="LATENT", tooltip="The video latent (every chunk), for MAGI-1 VAE Decode."
                ),
                JensenKVReport.Output(
                    display_name="report",
                    tooltip="Cache bytes, BF16 bytes, effective bits, K/V heads, what the reference's buffer costs.",
                ),
            ],
        )

    @classmethod
    def validate_inputs(cls, kv_ranges="5,4,3,2", steps=None, window_size=None):
        # the three inputs that depend on each other, and only those: ComfyUI attaches a failure to each input named
        # here (and skips its own min / max checks of them), so cfg and the rest stay with ComfyUI's checks
        for name, value, lo, hi in (("steps", steps, 1, 1000), ("window_size", window_size, 1, 4)):
            if value is not None and not lo <= value <= hi:
                return f"{name} {value} is outside {lo} to {hi}"
        try:
            ranges = parse_kv_ranges(kv_ranges) if kv_ranges is not None else None
        except ValueError as exc:
            return str(exc)
        if steps is not None and window_size is not None and steps % window_size:
            return f"steps {steps} is not a multiple of window_size {window_size}: each chunk spends steps / window_size forwards at each place"
        if steps is not None and ranges and steps % len(ranges):
            return f"steps {steps} does not split into the {len(ranges)} stages of kv_ranges {kv_ranges!r}"
        return True

    @classmethod
    def execute(
        cls,
        model,
        positive,
        width=720,
        height=720,
        frames=96,
        seed=1234,
        steps=16,
        window_size=4,
        cfg="auto",
        kv_ranges="5,4,3,2",
        window_chunks=0,
        sink_chunks=0,
        special_tokens=True,
    ) -> io.NodeOutput:
        chunk = CHUNK_FRAMES
        latent_frames = math.ceil(math.ceil(frames / GEOMETRY.vae_time_stride) / chunk) * chunk
        request = Magi1Request.from_options(
            model,
            positive,
            latent_frames=latent_frames,
            latent_height=height // GEOMETRY.vae_space_stride,
            latent_width=width // GEOMETRY.vae_space_stride,
            seed=int(seed),
            num_steps=int(steps),
            window_size=int(window_size),
            kv_ranges=parse_kv_ranges(kv_ranges),
            cfg_number=None if cfg == "auto" else int(cfg),
            window_chunks=int(window_chunks),
            sink_chunks=int(sink_chunks),
            chunk_frames=chunk,
            special_tokens=bool(special_tokens),
        )
        result = run(request)
        text = report_text(result.report)
        logger.info("jensen_kv: %s", text.replace("\n", " "))
        return io.NodeOutput(
            {"samples": result.samples}, result.report, ui={UI_REPORT_KEY: [result.report], "text": [text]}
        )


#: the family's nodes, in the order ComfyUI lists them (nodes/__init__.py finds this file by the family's key)
NODES: list[type[io.ComfyNode]] = [
    JensenKVLoadMagi1,
    JensenKVLoadMagi1VAE,
    JensenKVMagi1VAEDecode,
    JensenKVMagi1TextEncode,
    JensenKVMagi1ARSampler,
]
