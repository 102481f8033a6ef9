"""Chunked AR Video Sampler: a whole Wan video, chunk by chunk, with a (quantized) KV cache."""

from __future__ import annotations

from comfy_api.latest import io

from ..runtime.chunk_loop import CONTEXT_NOISE_MODES, RECACHE_MODES, ChunkedARRequest, report_text, run
from ..runtime.config import CHUNK_DEFAULTS
from ..runtime.saved_run import SavedRun
from .common import (
    CATEGORY,
    Combo,
    JensenKVCache,
    JensenKVReport,
    advanced,
    keeps_ui,
    output_connected,
    sampled_output,
)

DESCRIPTION = (
    "Chunk-wise autoregressive sampling for Self-Forcing / CausVid / SkyReels-V2 DF (Wan 2.1 T2V; SkyReels-V2 DF as an "
    "experimental causal variant: its reference attends bidirectionally without a KV cache): each chunk of latent "
    "frames is denoised with ComfyUI's sampler while attending to a KV cache of the finished chunks, then written to "
    "the cache once. Without Quantize KV Cache upstream the cache is full precision (the A/B baseline). Optional: a "
    "prompt schedule as positive (Prompt Schedule), a prefix clip to extend, a saved KV cache to continue, and a KV "
    "cache output to continue later."
)
KV_CACHE_OUTPUT = 2  # index of the kv_cache output (its connection decides whether the last chunk is cached)


def common_head_inputs() -> list:
    return [
        io.Model.Input(
            "model",
            tooltip="The video model (Wan 2.1 T2V); through Quantize KV Cache and Jensen Bias Correction for a "
            "smaller memory of past frames.",
        ),
        io.Conditioning.Input(
            "positive",
            tooltip="What the video shows: text conditioning for the whole video, or prompts by chunk from Prompt "
            "Schedule.",
        ),
        io.Conditioning.Input(
            "negative", tooltip="What the video should avoid (negative conditioning); unused when cfg is 1."
        ),
        io.Latent.Input(
            "latent",
            tooltip="The empty video to fill, which sets its size and length (e.g. EmptyHunyuanLatentVideo); it is "
            "generated chunk by chunk.",
        ),
        io.Int.Input(
            "seed",
            default=0,
            min=0,
            max=0xFFFFFFFFFFFFFFFF,
            control_after_generate=True,
            tooltip="Picks the video's random noise: the same seed gives the same video. Every chunk gets its own "
            "noise from the seed and its index, so a continued run matches one long run.",
        ),
    ]


def cfg_input() -> io.Float.Input:
    return io.Float.Input(
        "cfg",
        default=1.0,
        min=0.0,
        max=100.0,
        step=0.1,
        round=0.01,
        tooltip="How strictly the video follows the prompt. 1 for distilled few-step models (Self-Forcing, "
        "CausVid): fastest. Above 1 each step runs twice and both branches are cached (twice the cache).",
    )


def common_tail_inputs() -> list:
    return [
        io.Int.Input(
            "chunk_frames",
            default=CHUNK_DEFAULTS["chunk_frames"],
            min=1,
            max=1024,
            tooltip="How many latent frames are made at once (a latent frame is 4 video frames): use the model's "
            "own, 3 for Self-Forcing / CausVid.",
        ),
        io.Int.Input(
            "window_chunks",
            default=CHUNK_DEFAULTS["window_chunks"],
            min=0,
            max=4096,
            tooltip="How many finished chunks the model remembers: fewer is less memory and faster, but it forgets "
            "sooner. 0 remembers them all (a sliding window otherwise).",
        ),
        advanced(
            io.Float.Input(
                "context_noise",
                default=0.0,
                min=0.0,
                max=1.0,
                step=0.01,
                tooltip="Lets the remembered frames be slightly noisy, for models trained that way; 0 = clean, as "
                "Self-Forcing and CausVid. In sigma (Wan flow matching: sigma = t / 1000; SkyReels-V2's "
                "addnoise_condition 20 is 0.02 here); context_noise_mode says what it does.",
            )
        ),
        io.Int.Input(
            "sink_chunks",
            default=CHUNK_DEFAULTS["sink_chunks"],
            min=0,
            max=4096,
            optional=True,
            tooltip="Frames the model never forgets: the first N chunks stay remembered for the whole video, "
            "outside the window, which keeps a long video's look steady. Only matters with a window.",
        ),
        io.Latent.Input(
            "prefix",
            optional=True,
            tooltip="A clip to continue: a video LATENT (VAE-encoded frames, or an earlier run's output) that "
            "becomes the first chunks; generation continues after it.",
        ),
        advanced(
            io.Boolean.Input(
                "include_prefix",
                default=True,
                optional=True,
                tooltip="Put the prefix frames in front of the output video (off: only the new frames).",
            )
        ),
        JensenKVCache.Input(
            "kv_cache",
            optional=True,
            tooltip="Continue a saved run (Load KV Cache, or another sampler's kv_cache output): same model, "
            "Quantize KV Cache, chunk length, window, sink and video size.",
        ),
        advanced(
            io.Boolean.Input(
                "recache_on_switch",
                default=True,
                optional=True,
                tooltip="When the prompt schedule switches prompts, re-remember the past frames under the new "
                "prompt so the switch takes hold (recache_mode says how). Off keeps what was remembered "
                "under the old prompt.",
            )
        ),
        *krea_inputs(),
        advanced(
            Combo(
                "recache_mode",
                options=list(RECACHE_MODES),
                default="longlive",
                optional=True,
                tooltip="How recache_on_switch redoes the memory. longlive (default): NVlabs/LongLive's re-cache - "
                "the sink keeps the old prompt's K/V, the window plus the chunk about to be evicted are "
                "recomputed in one forward without the block mask (within the first (sink + window + 1) "
                "chunks the sink is recomputed too, as in LongLive). causal: the pack's own, not "
                "LongLive's - every retained chunk, the sink included, one chunk per forward, each "
                "attending to the ones before it. See docs/long-videos.md.",
            )
        ),
        advanced(
            Combo(
                "context_noise_mode",
                options=list(CONTEXT_NOISE_MODES),
                default="relabel",
                optional=True,
                tooltip="What context_noise does to the remembered frames. relabel (Self-Forcing, CausVid, "
                "LongLive): the model sees the clean chunk with its timestep set to context_noise x 1000. "
                "skyreels (SkyReels-V2 DF's addnoise_condition): the cached chunks are noised to that "
                "level, with fresh noise at every denoising step. No effect at context_noise 0.",
            )
        ),
    ]
    # inputs added after v0.1 are optional, so API prompts and workflows saved before them still run


def first_chunk_inputs() -> list:
    """The first chunk's own schedule and length (Causal Forcing++, an independent first frame); optional."""
    return [
        io.Sigmas.Input(
            "first_chunk_sigmas",
            optional=True,
            tooltip="Optional: other steps for the video's first chunk, e.g. AR Video Schedule "
            "causal_forcing_framewise_4step for Causal Forcing++ 2-step / 1-step, whose first frame takes "
            "4 steps. Unconnected: the schedule sigmas carry (AR Video Schedule's "
            "causal_forcing_framewise_2step / _1step carry the 4 steps), else sigmas. A continued kv_cache "
            "run uses sigmas.",
        ),
        first_chunk_frames_input(),
    ]


def first_chunk_frames_input() -> io.Int.Input:
    return advanced(
        io.Int.Input(
            "first_chunk_frames",
            default=0,
            min=0,
            max=1024,
            optional=True,
            tooltip="Length of the video's first chunk in latent frames (a prefix's first chunk when extending a "
            "clip); 0 = chunk_frames. 1 for models trained with an independent first frame (Self-Forcing's "
            "/ Causal Forcing's blocks of 1, k, k, ...); at most chunk_frames. A continued kv_cache run "
            "already has its first chunk.",
        )
    )


def krea_inputs() -> list:
    """Krea Realtime 14B's cache settings (docs/checkpoints.md#krea-realtime-14b)."""
    return [
        advanced(
            io.Int.Input(
                "recompute_frames",
                default=0,
                min=0,
                max=64,
                optional=True,
                tooltip="Krea Realtime only (Krea: 3): before each chunk, rebuild the memory from the last N "
                "latent frames instead of keeping every chunk. 0 = off. Needs window and sink 0.",
            )
        ),
        advanced(
            io.Float.Input(
                "kv_cache_attention_bias",
                default=1.0,
                min=0.01,
                max=1.0,
                step=0.01,
                optional=True,
                tooltip="Krea Realtime only (Krea: 0.3): past frames weigh less, so each chunk follows its own "
                "prompt more. 1.0 = off. Adds log(bias) to the scores of every cached key but the first "
                "cached frame's.",
            )
        ),
        io.Vae.Input(
            "vae",
            optional=True,
            tooltip="With recompute_frames: re-encode the first remembered frame from pixels, as Krea does. "
            "Without it the latent frame is used as it is.",
        ),
    ]


def outputs() -> list:
    return [
        io.Latent.Output(
            display_name="LATENT", tooltip="The video latent (with the prefix in front when include_prefix)."
        ),
        JensenKVReport.Output(
            display_name="report",
            tooltip="Cache size, BF16 size, effective bits, seconds per chunk, where each prompt started.",
        ),
        JensenKVCache.Output(
            display_name="kv_cache",
            tooltip="The run state to continue later (Save KV Cache, or a "
            "second sampler's kv_cache input). When connected, the "
            "last chunk is written to the cache too.",
        ),
    ]


def hidden_inputs() -> list:
    return [io.Hidden.unique_id, io.Hidden.prompt]


#: every input of the two sampler nodes that becomes a request option, and the option's name (a new input is one
#: schema line and one line here; its default comes from the schema)
REQUEST_OPTIONS = {
    "seed": "seed",
    "cfg": "cfg",
    "sampler": "sampler",
    "sigmas": "sigmas",
    "chunk_frames": "chunk_frames",
    "window_chunks": "window_chunks",
    "context_noise": "context_noise",
    "sink_chunks": "sink_chunks",
    "prefix": "prefix",
    "include_prefix": "include_prefix",
    "kv_cache": "resume",
    "recache_on_switch": "recache_on_switch",
    "first_chunk_sigmas": "first_chunk_sigmas",
    "first_chunk_frames": "first_chunk_frames",
    "recompute_frames": "recompute_frames",
    "kv_cache_attention_bias": "attention_bias",
    "vae": "vae",
    "recache_mode": "recache_mode",
    "context_noise_mode": "context_noise_mode",
}


def schema_defaults(node_cls) -> dict:
    """The default of every input of ``node_cls`` that has one (what an API prompt saved before it gets)."""
    return {i.id: i.default for i in node_cls.define_schema().inputs if getattr(i, "default", None) is not None}


def build_request(node_cls, model, positive, negative, latent, inputs: dict) -> ChunkedARRequest:
    """The request of one sampler node's inputs (each named in :data:`REQUEST_OPTIONS`; absent ones take the
    schema's default); the kv_cache output's connection decides ``keep_state``."""
    unknown = sorted(set(inputs) - set(REQUEST_OPTIONS))
    if unknown:
        raise TypeError(f"{node_cls.__name__} got inputs it does not know: {unknown}")
    values = {**schema_defaults(node_cls), **inputs}
    kv_cache = values.get("kv_cache")
    if kv_cache is not None and not isinstance(kv_cache, SavedRun):
        raise ValueError(
            f"kv_cache must come from Load KV Cache or a sampler's kv_cache output, got {type(kv_cache).__name__}"
        )
    if not values.get("recompute_frames"):
        values["vae"] = None  # the VAE re-encodes Krea's anchor frame only (a connected one is otherwise unused)
    options = {REQUEST_OPTIONS[k]: v for k, v in values.items() if k in REQUEST_OPTIONS}
    keep_state = output_connected(node_cls, KV_CACHE_OUTPUT)
    return ChunkedARRequest.from_options(model, positive, negative, latent, keep_state=keep_state, **options)


def sample_node(node_cls, model, positive, negative, latent, inputs: dict) -> io.NodeOutput:
    """Run the request of a sampler node's inputs; the LATENT, the report and the state to continue from."""
    result = run(build_request(node_cls, model, positive, negative, latent, inputs))
    # the report is shown on the node by web/jensen_kv.js from the ui payload (no progress text: it would repeat it)
    return sampled_output(latent, result, report_text(result.report), result.state)


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
                io.Sampler.Input(
                    "sampler",
                    tooltip="The steps of one chunk's denoising (AR Video Schedule for the few-step models, or "
                    "BasicScheduler); the same for every chunk.",
                ),
                io.Sigmas.Input(
                    "sigmas",
                    tooltip="The noise schedule of one chunk (BasicScheduler, or a few-step "
                    "Self-Forcing / CausVid schedule); reused for every chunk.",
                ),
                *common_tail_inputs(),
                *first_chunk_inputs(),
            ],
            outputs=outputs(),
            hidden=hidden_inputs(),
            **keeps_ui(),  # the report comes back on a cached rerun, as ComfyUI keeps images
        )

    @classmethod
    def execute(
        cls, model, positive, negative, latent, seed, cfg, sampler, sigmas, chunk_frames=3, window_chunks=0,
        context_noise=0.0, **inputs,
    ) -> io.NodeOutput:  # fmt: skip
        required = dict(seed=seed, cfg=cfg, sampler=sampler, sigmas=sigmas)
        tail = dict(chunk_frames=chunk_frames, window_chunks=window_chunks, context_noise=context_noise)
        return sample_node(cls, model, positive, negative, latent, {**required, **tail, **inputs})
