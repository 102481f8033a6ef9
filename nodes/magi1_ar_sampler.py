"""MAGI-1 AR Sampler: a MAGI-1 video by its own multi-noise chunk pipeline, finished chunks in the pack's KV cache."""

from __future__ import annotations

import math

from comfy_api.latest import io

from ..runtime.families import MAGI1
from .common import UI_REPORT_KEY, JensenKVReport, advanced, check_combo_values, logger
from .load_magi1 import MAGI1_CATEGORY

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
                    default=MAGI1.default_steps,
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
                io.Combo.Input(
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
    def validate_inputs(cls, cfg="auto", kv_ranges="5,4,3,2", steps=None, window_size=None, **_):
        combos = check_combo_values(cls, cfg=cfg)
        if combos is not True:
            return combos
        try:
            ranges = MAGI1.parse_kv_ranges(kv_ranges) if kv_ranges is not None else None
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
        chunk = MAGI1.chunk_frames
        latent_frames = math.ceil(math.ceil(frames / MAGI1.vae_time_stride) / chunk) * chunk
        request = MAGI1.Request(
            model,
            positive,
            latent_frames=latent_frames,
            latent_height=height // MAGI1.vae_space_stride,
            latent_width=width // MAGI1.vae_space_stride,
            seed=int(seed),
            num_steps=int(steps),
            window_size=int(window_size),
            kv_ranges=MAGI1.parse_kv_ranges(kv_ranges),
            cfg_number=None if cfg == "auto" else int(cfg),
            window_chunks=int(window_chunks),
            sink_chunks=int(sink_chunks),
            chunk_frames=chunk,
            special_tokens=bool(special_tokens),
        )
        result = MAGI1.run(request)
        text = MAGI1.report_text(result.report)
        logger.info("jensen_kv: %s", text.replace("\n", " "))
        return io.NodeOutput(
            {"samples": result.samples}, result.report, ui={UI_REPORT_KEY: [result.report], "text": [text]}
        )
