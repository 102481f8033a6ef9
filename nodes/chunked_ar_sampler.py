"""Chunked AR Video Sampler: a whole Wan video, chunk by chunk, with a (quantized) KV cache."""
from __future__ import annotations

from comfy_api.latest import io

from ..runtime.chunk_loop import report_text, run_chunked_ar
from .common import CATEGORY, UI_REPORT_KEY, JensenKVReport, advanced, logger

DESCRIPTION = (
    "Chunk-wise autoregressive sampling for Self-Forcing / CausVid / SkyReels-V2 (Wan 2.1 T2V): each chunk of latent "
    "frames is denoised with ComfyUI's sampler while attending to a KV cache of the finished chunks, then written to "
    "the cache once. Without Quantize KV Cache upstream the cache is full precision (the A/B baseline)."
)


def common_head_inputs() -> list:
    return [
        io.Model.Input("model", tooltip="A Wan 2.1 text-to-video MODEL, optionally through Quantize KV Cache and "
                                        "Jensen Bias Correction."),
        io.Conditioning.Input("positive", tooltip="Text conditioning (one entry) for the whole video."),
        io.Conditioning.Input("negative", tooltip="Negative conditioning (one entry); unused when cfg is 1."),
        io.Latent.Input("latent", tooltip="A Wan video latent (batch, 16, frames, height, width), e.g. from "
                                          "EmptyHunyuanLatentVideo; its frames are generated chunk by chunk."),
        io.Int.Input("seed", default=0, min=0, max=0xFFFFFFFFFFFFFFFF, control_after_generate=True,
                     tooltip="Noise seed; the noise of the whole video is drawn once and sliced per chunk."),
    ]


def cfg_input() -> io.Float.Input:
    return io.Float.Input("cfg", default=1.0, min=0.0, max=100.0, step=0.1, round=0.01,
                          tooltip="Classifier-free guidance; 1 runs the cond branch only (distilled few-step "
                                  "models), >1 keeps a second cache for the uncond branch.")


def common_tail_inputs() -> list:
    return [
        io.Int.Input("chunk_frames", default=3, min=1, max=1024,
                     tooltip="Latent frames per chunk (3 for Self-Forcing / CausVid; a latent frame is 4 video frames)."),
        io.Int.Input("window_chunks", default=0, min=0, max=4096,
                     tooltip="How many finished chunks stay in the KV cache (sliding window); 0 keeps them all."),
        advanced(io.Float.Input("context_noise", default=0.0, min=0.0, max=1.0, step=0.01,
                                tooltip="Noise level of the pass that writes a finished chunk to the cache, as a fraction "
                                        "of the model's max sigma (Wan flow matching: the sigma itself). 0 = clean "
                                        "context, as Self-Forcing and CausVid do.")),
    ]


def outputs() -> list:
    return [
        io.Latent.Output(display_name="LATENT", tooltip="The whole video latent."),
        JensenKVReport.Output(display_name="report", tooltip="Cache size, BF16 size, effective bits, seconds per chunk."),
    ]


def sample_node(node_cls, model, positive, negative, latent, seed, cfg, sampler, sigmas, chunk_frames,
                window_chunks, context_noise) -> io.NodeOutput:
    result = run_chunked_ar(model, positive, negative, latent, seed=seed, cfg=cfg, sampler=sampler, sigmas=sigmas,
                            chunk_frames=chunk_frames, window_chunks=window_chunks, context_noise=context_noise)
    out = latent.copy()
    out.pop("downscale_ratio_spacial", None)
    out["samples"] = result.samples
    text = report_text(result.report)
    logger.info("jensen_kv: %s", text.replace("\n", " "))
    # the report is shown on the node by web/jensen_kv.js from the ui payload (no progress text: it would repeat it)
    return io.NodeOutput(out, result.report, ui={UI_REPORT_KEY: [result.report], "text": [text]})


class JensenKVChunkedARSampler(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="JensenKVChunkedARSampler",
            display_name="Chunked AR Video Sampler",
            category=CATEGORY,
            description=DESCRIPTION,
            inputs=[
                *common_head_inputs(),
                cfg_input(),
                io.Sampler.Input("sampler", tooltip="Any ComfyUI sampler (KSamplerSelect, ...); used for every chunk."),
                io.Sigmas.Input("sigmas", tooltip="The noise schedule of one chunk (BasicScheduler, or a few-step "
                                                  "Self-Forcing / CausVid schedule); reused for every chunk."),
                *common_tail_inputs(),
            ],
            outputs=outputs(),
            hidden=[io.Hidden.unique_id],
        )

    @classmethod
    def execute(cls, model, positive, negative, latent, seed, cfg, sampler, sigmas, chunk_frames=3,
                window_chunks=0, context_noise=0.0) -> io.NodeOutput:
        return sample_node(cls, model, positive, negative, latent, seed, cfg, sampler, sigmas, chunk_frames,
                           window_chunks, context_noise)
