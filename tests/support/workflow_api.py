"""Turn a UI-format workflow (example_workflows/*.json) into the API prompt the front end would queue.

What the front end does on Queue: every node except front-end-only ones (Note, Reroute, ...) and
muted/bypassed ones becomes ``{"class_type", "inputs"}``; widget values are mapped to input names in
the order of ``/object_info``'s ``input_order`` (a seed's control_after_generate value is skipped);
links become ``[origin_id, origin_slot]``.

A file saved before a node gained a widget has no value for it: the front end keeps that widget at its
default (v0.27's CreateVideo got an optional ``bit_depth`` after ``fps``; a workflow saved with v0.3.64's
front end loads in v0.27's with ``bit_depth`` = 8). :func:`frontend_defaults` names those widgets; ComfyUI
itself adds inputs that way (optional, with a default, after the existing ones), so only such inputs may
be missing from a file.
"""

from __future__ import annotations

FRONTEND_ONLY = {"Note", "MarkdownNote", "Reroute", "PrimitiveNode"}
#: Quantize KV Cache's widgets at INT2 g32 with the Hadamard rotation and FP8 scales; Jensen Bias Correction's, taylor
QUANT_INT2 = {
    "key_bits": "2",
    "value_bits": "2",
    "group_size": "32",
    "rotation": "hadamard",
    "scale_format": "fp8_e4m3",
    "rotation_seed": 0,
}
JENSEN_TAYLOR = {"mode": "taylor", "strength": 1.0}


#: the Chunked AR Video Sampler's widgets in a saved workflow, in order (the required ones, then the optional ones
#: added later); the Simple sampler puts steps, sampler_name and scheduler after cfg
CHUNKED_SAMPLER_WIDGETS = (
    "seed",
    "control",
    "cfg",
    "chunk_frames",
    "window_chunks",
    "context_noise",
    "sink_chunks",
    "include_prefix",
    "recache_on_switch",
    "recompute_frames",
    "kv_cache_attention_bias",
    "recache_mode",
    "context_noise_mode",
    "first_chunk_frames",
)


def sampler_widgets(node: dict) -> dict:
    """A saved Chunked AR Video Sampler (or its Simple variant) node's widget values by name."""
    names = list(CHUNKED_SAMPLER_WIDGETS)
    if node["type"] == "JensenKVChunkedARSamplerSimple":
        names = ["seed", "control", "steps", "cfg", "sampler_name", "scheduler", *names[3:]]
    return dict(zip(names, node["widgets_values"]))


def chunked_sampler(model: list, *, seed: int = 0, chunk_frames: int = 1, window_chunks: int = 0, **widgets) -> dict:
    """The API prompt's Chunked AR Video Sampler node on the MODEL link ``model``, at cfg 1 with no context noise
    (``widgets`` over them), linked as the tiny prompts link it: positive ``"4"``, negative ``"5"``, latent ``"6"``,
    SAMPLER ``"7"``, SIGMAS ``"8"``."""
    links = {"positive": ["4", 0], "negative": ["5", 0], "latent": ["6", 0], "sampler": ["7", 0], "sigmas": ["8", 0]}
    chunks = {"chunk_frames": chunk_frames, "window_chunks": window_chunks, "context_noise": 0.0}
    inputs = {"model": model, **links, "seed": seed, "cfg": 1.0, **chunks, **widgets}
    return {"class_type": "JensenKVChunkedARSampler", "inputs": inputs}


def int2_jensen(model: list, quant: str = "2", jensen: str = "3", **quant_widgets) -> dict:
    """The API prompt's nodes ``quant`` (Quantize KV Cache, :data:`QUANT_INT2` with ``quant_widgets`` over it) on the
    MODEL link ``model`` and ``jensen`` (Jensen Bias Correction, taylor 1.0) on it."""
    return {
        quant: {"class_type": "JensenKVQuantizeKVCache", "inputs": {"model": model, **QUANT_INT2, **quant_widgets}},
        jensen: {"class_type": "JensenKVBiasCorrection", "inputs": {"model": [quant, 0], **JENSEN_TAYLOR}},
    }


def wan_t2v_head(unet: str, **quant_widgets) -> dict:
    """The first nodes of the server tests' tiny Wan prompts: ``1`` UNETLoader of ``unet``, ``2``/``3`` INT2 +
    Jensen on it (:func:`int2_jensen`), ``4``/``5`` the test conditionings (positive, negative: 16 tokens of 4096)."""
    return {
        "1": {"class_type": "UNETLoader", "inputs": {"unet_name": unet, "weight_dtype": "default"}},
        **int2_jensen(["1", 0], **quant_widgets),
        "4": {"class_type": "JensenKVTestConditioning", "inputs": {"seed": 1, "tokens": 16, "width": 4096}},
        "5": {"class_type": "JensenKVTestConditioning", "inputs": {"seed": 2, "tokens": 16, "width": 4096}},
    }


WIDGET_TYPES = {"INT", "FLOAT", "STRING", "BOOLEAN", "COMBO"}


def widget_specs(info: dict):
    """The widgets of a node (its ``/object_info`` entry ``info``) in the front end's order: ``(name, kind, options)``
    for each input that is a widget (a widget type, not ``forceInput``)."""
    order = [*info["input_order"].get("required", []), *info["input_order"].get("optional", [])]
    specs = {**info["input"].get("required", {}), **info["input"].get("optional", {})}
    for name in order:
        spec = specs[name]
        kind = "COMBO" if isinstance(spec[0], list) else spec[0]
        opts = spec[1] if len(spec) > 1 else {}
        if kind in WIDGET_TYPES and not opts.get("forceInput"):
            yield name, kind, opts


def has_control(name: str, kind: str, opts: dict) -> bool:
    """Whether the front end puts a control_after_generate value after this widget's."""
    return bool(opts.get("control_after_generate")) or (kind == "INT" and name in ("seed", "noise_seed"))


UPLOAD_FLAGS = ("image_upload", "video_upload", "audio_upload")


def _widget_names(info: dict) -> list[tuple[str, bool]]:
    """(input name, followed by an extra front-end value: control_after_generate or an upload button)."""
    return [
        (name, has_control(name, kind, opts) or any(opts.get(k) for k in UPLOAD_FLAGS))
        for name, kind, opts in widget_specs(info)
    ]


def frontend_defaults(node: dict, info: dict) -> dict:
    """The widgets of ``node`` after the last value in its ``widgets_values``, which the front end fills with
    their defaults: {input name: default}. Raises ValueError when one of them is required or has no default
    (the file would load with a value nobody chose)."""
    values = list(node.get("widgets_values") or [])
    optional = set(info["input_order"].get("optional", []))
    specs = {**info["input"].get("required", {}), **info["input"].get("optional", {})}
    out, i = {}, 0
    for name, extra in _widget_names(info):
        if i >= len(values):
            opts = specs[name][1] if len(specs[name]) > 1 else {}
            if name not in optional or "default" not in opts:
                raise ValueError(
                    f"{node['type']} #{node['id']}: no widget value for {name}"
                    f"{'' if name in optional else ' (a required input)'}"
                    f"{'' if 'default' in opts else ' (no default)'}"
                )
            out[name] = opts["default"]
        i += 2 if extra else 1
    return out


def ui_to_api(wf: dict, object_info: dict, overrides: dict | None = None) -> dict:
    """The API prompt of ``wf``; ``overrides`` = {node_id: {input: value}} replaces widget values."""
    links = {lk[0]: lk for lk in wf["links"]}
    prompt = {}
    for node in wf["nodes"]:
        if node["type"] in FRONTEND_ONLY or node.get("mode", 0) in (2, 4):
            continue
        info = object_info[node["type"]]
        inputs = {}
        values = list(node.get("widgets_values") or [])
        i = 0
        for name, control in _widget_names(info):
            if i < len(values):
                inputs[name] = values[i]
            i += 2 if control else 1
        inputs.update(frontend_defaults(node, info))
        for inp in node.get("inputs", []):
            if inp.get("link") is not None:
                lk = links[inp["link"]]
                inputs[inp["name"]] = [str(lk[1]), lk[2]]
        inputs.update((overrides or {}).get(node["id"], {}))
        prompt[str(node["id"])] = {"class_type": node["type"], "inputs": inputs}
    return prompt
