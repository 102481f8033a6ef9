"""The shipped workflows, described once, and built into UI-format JSON by the real front end.

``python tests/web/build_workflows.py`` starts a throwaway ComfyUI server with the pack, opens the
front end in headless Chromium, creates each graph below with LiteGraph (nodes, widget values by
name, links by slot name), and saves ``app.graph.serialize()`` - exactly what ComfyUI's Save writes
- to ``workflows/<name>.json``. The tests read the JSON files; this module also tells them which
model file names the loaders use, so placeholder files can be created for combo validation.
"""
from __future__ import annotations

# ------------------------------------------------------------------------------------------ models
VAE = "wan_2.1_vae.safetensors"
TEXT_ENCODER = "umt5_xxl_fp8_e4m3fn_scaled.safetensors"
SELF_FORCING = "self_forcing_dmd.safetensors"
SKYREELS_DF = "Wan2_1-SkyReels-V2-DF-1_3B-540P_fp32.safetensors"

# folder (under ComfyUI/models) -> files the workflows name
MODEL_FILES: dict[str, tuple[str, ...]] = {
    "diffusion_models": (SELF_FORCING, SKYREELS_DF),
    "text_encoders": (TEXT_ENCODER,),
    "vae": (VAE,),
}

_COMMON_FILES = f"""Model files (put them under ComfyUI/models/, then press R to refresh the loaders):
- models/text_encoders/{TEXT_ENCODER}
  from Comfy-Org/Wan_2.1_ComfyUI_repackaged (split_files/text_encoders); load it with CLIPLoader type "wan".
- models/vae/{VAE}
  from Comfy-Org/Wan_2.1_ComfyUI_repackaged (split_files/vae)."""

_SELF_FORCING_FILE = f"""- models/diffusion_models/{SELF_FORCING}
  Self-Forcing (Wan 2.1 T2V 1.3B, chunk-wise causal): gdhe17/Self-Forcing ships checkpoints/self_forcing_dmd.pt;
  save its "generator_ema" state dict as a .safetensors with this name (ComfyUI loads it as wan2.1).
  CausVid works the same way: tianweiy/CausVid autoregressive_checkpoint/model.pt, its "generator" state dict;
  pick that file in Load Diffusion Model instead."""

_PLANNER_TIP = """Before you press Run: the Quantize KV Cache node shows the effective bits and, under
"Memory planner", the projected peak cache size at BF16 and at the chosen setting (it follows this
workflow's latent size, chunk, window and cfg; pick the model preset or type layers/heads/head_dim).
After the run the sampler shows what the cache really cost and the seconds per chunk."""

NOTE_SELF_FORCING = f"""Self-Forcing / CausVid text-to-video with a 2-bit KV cache + Jensen bias correction

Wan 2.1 T2V 1.3B, chunk-wise autoregressive: 832x480, 81 frames = 21 latent frames, generated
3 latent frames per chunk (7 chunks). Few-step schedule of Self-Forcing: shift 5, 4 steps
(t = 1000, 750, 500, 250), LCM sampler (predict x0, re-noise), cfg 1 (one CFG branch cached).
The KV cache of finished chunks is stored in INT2 (group 32, FP8 scales: 2.75 bits/element,
5.8x smaller than BF16) and the Jensen bias correction removes the attention shift that
quantized keys cause.

{_COMMON_FILES}
{_SELF_FORCING_FILE}

{_PLANNER_TIP}"""

NOTE_SKYREELS = f"""SkyReels-V2 Diffusion Forcing (1.3B, 540P) with cfg 6: both CFG branches cached in INT2 + Jensen

Wan 2.1 T2V architecture, 960x544, 97 frames = 25 latent frames, 5 latent frames per chunk
(5 chunks), 30 UniPC steps per chunk with shift 8 and cfg 6. With cfg > 1 the sampler keeps a
second cache for the negative (uncond) branch, so the cache costs twice as much: the planner on
Quantize KV Cache shows "cfg branches 2".

{_COMMON_FILES}
- models/diffusion_models/{SKYREELS_DF}
  from Kijai/WanVideo_comfy (Skyreels/ folder), or Skywork/SkyReels-V2-DF-1.3B-540P converted to
  one .safetensors; ComfyUI detects it as wan2.1.

{_PLANNER_TIP}"""

NOTE_AB = f"""A/B: the same seed through a BF16 cache, an INT2 cache, and INT2 + Jensen bias correction

Three Chunked AR samplers share the model, prompt, latent, schedule and seed (42, fixed):
  left   - BF16 cache: no patch nodes, the sampler keeps full-precision keys and values;
  middle - INT2 cache: Quantize KV Cache, no correction;
  right  - INT2 + Jensen: Quantize KV Cache -> Jensen Bias Correction (taylor, strength 1).
The three decoded videos are stitched side by side into one video (jensen_kv/ab_*.mp4).
Each sampler reports its cache size and seconds per chunk on the node.

{_COMMON_FILES}
{_SELF_FORCING_FILE}

{_PLANNER_TIP}"""

PROMPT = ("A red fox trotting through fresh snow in a birch forest at golden hour, soft light, "
          "shallow depth of field, the camera tracking alongside it")
PROMPT_SKYREELS = ("A sailboat gliding across a calm turquoise bay, gentle waves, seagulls overhead, "
                   "cinematic wide shot, late afternoon sun")
NEGATIVE = ("blurry, low quality, distorted, overexposed, static, jpeg artifacts, extra limbs, "
            "deformed, watermark, text, subtitles")


def _n(key, type_, col, widgets=None, title=None, size=None, color=None, bgcolor=None, align=None, below=None):
    """A node in layout column ``col``, stacked in spec order; ``align``: top no higher than that node's
    top; ``below``: top under that node's bottom (both name nodes placed earlier in the list)."""
    return {"key": key, "type": type_, "col": col, "widgets": widgets or {}, "title": title,
            "size": size, "color": color, "bgcolor": bgcolor, "align": align, "below": below}


def _note(text, size=(560, 640)):
    return _n("note", "Note", 0, {"text": text}, title="Read me: model files and what this does", size=list(size),
              color="#432", bgcolor="#653")


def _loaders(unet=SELF_FORCING, shift=5.0):
    return [
        _n("unet", "UNETLoader", 1, {"unet_name": unet, "weight_dtype": "default"}, size=[340, 90]),
        _n("shift", "ModelSamplingSD3", 1, {"shift": shift}),
        _n("clip", "CLIPLoader", 1, {"clip_name": TEXT_ENCODER, "type": "wan", "device": "default"}, size=[340, 110]),
        _n("vae", "VAELoader", 1, {"vae_name": VAE}, size=[340, 60]),
    ]


QUANT_INT2 = {"key_bits": "2", "value_bits": "2", "group_size": "32", "rotation": "hadamard",
              "scale_format": "fp8_e4m3", "rotation_seed": 0}
JENSEN_TAYLOR = {"mode": "taylor", "strength": 1.0}


def _self_forcing() -> dict:
    nodes = [
        _note(NOTE_SELF_FORCING),
        *_loaders(),
        _n("pos", "CLIPTextEncode", 2, {"text": PROMPT}, title="Prompt", size=[400, 160]),
        _n("neg", "ConditioningZeroOut", 2, title="Negative (unused at cfg 1)"),
        _n("latent", "EmptyHunyuanLatentVideo", 2, {"width": 832, "height": 480, "length": 81, "batch_size": 1}),
        _n("select", "KSamplerSelect", 2, {"sampler_name": "lcm"}, title="Sampler (LCM: x0, then re-noise)"),
        _n("sched", "BasicScheduler", 2, {"scheduler": "simple", "steps": 4, "denoise": 1.0},
           title="Few-step schedule (shift 5, 4 steps)"),
        _n("quant", "JensenKVQuantizeKVCache", 3, QUANT_INT2),
        _n("jensen", "JensenKVBiasCorrection", 4, JENSEN_TAYLOR),
        _n("sampler", "JensenKVChunkedARSampler", 5,
           {"seed": 42, "control_after_generate": "fixed", "cfg": 1.0, "chunk_frames": 3, "window_chunks": 0,
            "context_noise": 0.0}),
        _n("decode", "VAEDecode", 6),
        _n("video", "CreateVideo", 6, {"fps": 16.0}),
        _n("save", "SaveVideo", 6, {"filename_prefix": "jensen_kv/self_forcing_int2_jensen",
                                    "format": "auto", "codec": "auto"}, size=[400, 360]),
    ]
    links = [
        ("unet", "MODEL", "shift", "model"),
        ("shift", "MODEL", "quant", "model"),
        ("quant", "MODEL", "jensen", "model"),
        ("jensen", "MODEL", "sampler", "model"),
        ("shift", "MODEL", "sched", "model"),
        ("clip", "CLIP", "pos", "clip"),
        ("pos", "CONDITIONING", "neg", "conditioning"),
        ("pos", "CONDITIONING", "sampler", "positive"),
        ("neg", "CONDITIONING", "sampler", "negative"),
        ("latent", "LATENT", "sampler", "latent"),
        ("select", "SAMPLER", "sampler", "sampler"),
        ("sched", "SIGMAS", "sampler", "sigmas"),
        ("sampler", "LATENT", "decode", "samples"),
        ("vae", "VAE", "decode", "vae"),
        ("decode", "IMAGE", "video", "images"),
        ("video", "VIDEO", "save", "video"),
    ]
    return {"name": "jensen_kv_self_forcing_t2v_int2_jensen", "nodes": nodes, "links": links, "groups": []}


def _skyreels() -> dict:
    nodes = [
        _note(NOTE_SKYREELS),
        *_loaders(unet=SKYREELS_DF, shift=8.0),
        _n("pos", "CLIPTextEncode", 2, {"text": PROMPT_SKYREELS}, title="Prompt", size=[400, 160]),
        _n("neg", "CLIPTextEncode", 2, {"text": NEGATIVE}, title="Negative prompt", size=[400, 130]),
        _n("latent", "EmptyHunyuanLatentVideo", 2, {"width": 960, "height": 544, "length": 97, "batch_size": 1}),
        _n("quant", "JensenKVQuantizeKVCache", 3, QUANT_INT2),
        _n("jensen", "JensenKVBiasCorrection", 4, JENSEN_TAYLOR),
        _n("sampler", "JensenKVChunkedARSamplerSimple", 5,
           {"seed": 7, "control_after_generate": "fixed", "steps": 30, "cfg": 6.0, "sampler_name": "uni_pc",
            "scheduler": "simple", "chunk_frames": 5, "window_chunks": 0, "context_noise": 0.0}),
        _n("decode", "VAEDecode", 6),
        _n("video", "CreateVideo", 6, {"fps": 24.0}),
        _n("save", "SaveVideo", 6, {"filename_prefix": "jensen_kv/skyreels_df_cfg6_int2_jensen",
                                    "format": "auto", "codec": "auto"}, size=[400, 360]),
    ]
    links = [
        ("unet", "MODEL", "shift", "model"),
        ("shift", "MODEL", "quant", "model"),
        ("quant", "MODEL", "jensen", "model"),
        ("jensen", "MODEL", "sampler", "model"),
        ("clip", "CLIP", "pos", "clip"),
        ("clip", "CLIP", "neg", "clip"),
        ("pos", "CONDITIONING", "sampler", "positive"),
        ("neg", "CONDITIONING", "sampler", "negative"),
        ("latent", "LATENT", "sampler", "latent"),
        ("sampler", "LATENT", "decode", "samples"),
        ("vae", "VAE", "decode", "vae"),
        ("decode", "IMAGE", "video", "images"),
        ("video", "VIDEO", "save", "video"),
    ]
    return {"name": "jensen_kv_skyreels_v2_df_cfg_int2_jensen", "nodes": nodes, "links": links, "groups": []}


def _ab() -> dict:
    seed = {"seed": 42, "control_after_generate": "fixed", "cfg": 1.0, "chunk_frames": 3, "window_chunks": 0,
            "context_noise": 0.0}
    stitch = {"direction": "right", "match_image_size": True, "spacing_width": 8, "spacing_color": "white"}
    nodes = [
        _note(NOTE_AB),
        *_loaders(),
        _n("pos", "CLIPTextEncode", 2, {"text": PROMPT}, title="Prompt", size=[400, 160]),
        _n("neg", "ConditioningZeroOut", 2, title="Negative (unused at cfg 1)"),
        _n("latent", "EmptyHunyuanLatentVideo", 2, {"width": 832, "height": 480, "length": 81, "batch_size": 1}),
        _n("select", "KSamplerSelect", 2, {"sampler_name": "lcm"}, title="Sampler (LCM: x0, then re-noise)"),
        _n("sched", "BasicScheduler", 2, {"scheduler": "simple", "steps": 4, "denoise": 1.0},
           title="Few-step schedule (shift 5, 4 steps)"),
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
        _n("video", "CreateVideo", 7, {"fps": 16.0}, align="s_int2"),
        _n("save", "SaveVideo", 7, {"filename_prefix": "jensen_kv/ab_bf16_int2_int2jensen",
                                    "format": "auto", "codec": "auto"}, size=[640, 300]),
    ]
    links = [
        ("unet", "MODEL", "shift", "model"),
        ("shift", "MODEL", "sched", "model"),
        ("shift", "MODEL", "s_bf16", "model"),
        ("shift", "MODEL", "quant", "model"),
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
        ("stitch2", "IMAGE", "video", "images"),
        ("video", "VIDEO", "save", "video"),
    ]
    groups = [
        {"title": "A: BF16 cache (no patch nodes)", "members": ["s_bf16", "d_bf16"], "color": "#3f789e"},
        {"title": "B: INT2 cache", "members": ["quant", "s_int2", "d_int2"], "color": "#a1309b"},
        {"title": "C: INT2 + Jensen bias correction", "members": ["jensen", "s_jensen", "d_jensen"], "color": "#8A8"},
    ]
    return {"name": "jensen_kv_ab_bf16_int2_jensen", "nodes": nodes, "links": links, "groups": groups, "gap_y": 110}


WORKFLOWS: list[dict] = [_self_forcing(), _skyreels(), _ab()]

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
TINY_UNET = "jensen_kv_tiny_wan.safetensors"  # written by the browser test (tests/support/wan_tiny.DETECTABLE)


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
        _n("sampler", "JensenKVChunkedARSampler", 3,
           {"seed": 0, "control_after_generate": "fixed", "cfg": 2.0, "chunk_frames": 2, "window_chunks": 0,
            "context_noise": 0.0}),
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
