"""The shipped workflows (example_workflows/*.json, UI format) against a live ComfyUI's /object_info.

Every node type exists, every widget value is valid for its input (combo value among the options,
numbers in range, the right kind), every link joins an output and an input of the same type,
every required socket is connected; plus what each workflow promises (INT2 + Jensen, cfg, the A/B
arms) and a Note that names every model file the loaders use, in the folder ComfyUI reads it from.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.comfyui import PACK_ROOT
from support.workflow_api import (
    UPLOAD_FLAGS,
    WIDGET_TYPES,
    frontend_defaults,
    has_control,
    sampler_widgets,
    widget_specs,
)
from workflow_specs import (
    BUNDLED_MODELS,
    COMPANIONS,
    MAGI1_SAMPLER,
    MODEL_FILES,
    MODEL_LOADERS,
    MODEL_SOURCES,
    NO_LORA,
    STORY_CACHE,
    STORY_CACHE_NAME,
    T5_XXL,
    WORKFLOWS,
    write_placeholder_files,
)

WORKFLOW_DIR = PACK_ROOT / "example_workflows"
FILES = sorted(WORKFLOW_DIR.glob("*.json"))
FRONTEND_ONLY = {"Note", "MarkdownNote", "Reroute", "PrimitiveNode"}  # virtual nodes of the front end
#: input types whose widgets depend on another widget's value (0.33's Save Video ``format``)
DYNAMIC_WIDGET_TYPES = ("COMFY_DYNAMICCOMBO_V3",)
CONTROL_VALUES = {"fixed", "increment", "decrement", "randomize"}
SAMPLERS = {"JensenKVChunkedARSampler", "JensenKVChunkedARSamplerSimple"}


def load(path: Path) -> dict:
    return json.loads(path.read_text())


def by_name(name: str) -> dict:
    return load(WORKFLOW_DIR / f"{name}.json")


# ------------------------------------------------------------------------------ graph helpers
class Graph:
    def __init__(self, wf: dict):
        self.wf = wf
        self.nodes = {n["id"]: n for n in wf["nodes"]}
        self.links = {lk[0]: lk for lk in wf["links"]}

    def of_type(self, t: str) -> list[dict]:
        return [n for n in self.wf["nodes"] if n["type"] == t]

    def upstream(self, node: dict, input_name: str) -> dict | None:
        for inp in node.get("inputs", []):
            if inp["name"] == input_name and inp.get("link") is not None:
                return self.nodes[self.links[inp["link"]][1]]
        return None

    def model_chain(self, node: dict) -> list[str]:
        """Types of the nodes feeding ``node``'s MODEL input, nearest first."""
        chain, n = [], self.upstream(node, "model")
        while n is not None:
            chain.append(n["type"])
            n = self.upstream(n, "model")
        return chain

    def note_text(self) -> str:
        notes = self.of_type("Note") + self.of_type("MarkdownNote")
        assert notes, "every shipped workflow needs a Note saying which model files go where"
        return "\n".join(n["widgets_values"][0] for n in notes)


def widget_values(node: dict, info: dict) -> dict:
    """Map a UI node's positional widgets_values to input names, as the front end does.

    Widgets after the file's last value (an input the node gained after the file was saved, e.g. v0.27's
    CreateVideo bit_depth) get their default, as the front end gives them; only optional inputs with a
    default may be missing (``support.workflow_api.frontend_defaults``)."""
    values = list(node.get("widgets_values") or [])
    try:
        filled = frontend_defaults(node, info)
    except ValueError as exc:
        raise AssertionError(str(exc)) from None
    out, i = {}, 0
    for name, kind, opts in widget_specs(info):
        if name in filled:
            out[name] = filled[name]
            continue
        out[name] = values[i]
        i += 1
        if has_control(name, kind, opts):
            out[f"{name}:control_after_generate"] = values[i]
            i += 1
        if any(opts.get(k) for k in UPLOAD_FLAGS):  # the front end's upload button serializes a value too
            i += 1
    assert i == len(values), f"{node['type']} #{node['id']}: {len(values) - i} widget value(s) left over: {values[i:]}"
    return out


def check_value(where: str, spec: list, value) -> None:
    kind = "COMBO" if isinstance(spec[0], list) else spec[0]
    opts = spec[1] if len(spec) > 1 else {}
    if kind == "COMBO":
        choices = spec[0] if isinstance(spec[0], list) else opts.get("options", [])
        assert value in choices, f"{where}: {value!r} is not one of {choices}"
    elif kind in ("INT", "FLOAT"):
        ok = isinstance(value, int) if kind == "INT" else isinstance(value, (int, float))
        assert ok and not isinstance(value, bool), (
            f"{where}: {value!r} is not a{'n INT' if kind == 'INT' else ' FLOAT'}"
        )
        if "min" in opts:
            assert value >= opts["min"], f"{where}: {value} < min {opts['min']}"
        if "max" in opts:
            assert value <= opts["max"], f"{where}: {value} > max {opts['max']}"
    elif kind == "STRING":
        assert isinstance(value, str), f"{where}: {value!r} is not a string"
    elif kind == "BOOLEAN":
        assert isinstance(value, bool), f"{where}: {value!r} is not a boolean"


def validate(wf: dict, object_info: dict) -> list[str]:
    """All problems of one workflow against /object_info (empty list = valid)."""
    problems = []
    g = Graph(wf)
    for node in wf["nodes"]:
        t = node["type"]
        if t in FRONTEND_ONLY:
            continue
        info = object_info.get(t)
        if info is None:
            problems.append(f"node #{node['id']}: type {t!r} is not on the server (missing node)")
            continue
        specs = {**info["input"].get("required", {}), **info["input"].get("optional", {})}
        dynamic = [n for n, spec in specs.items() if spec[0] in DYNAMIC_WIDGET_TYPES]
        if dynamic:  # its sub-widgets come and go with the chosen option: one file cannot serve every version
            problems.append(
                f"{t} #{node['id']}: {dynamic} is a dynamic combo ({specs[dynamic[0]][0]}), whose widget values this "
                "ComfyUI reads differently from older ones; use a node whose inputs every supported version shares"
            )
            continue
        try:
            for name, value in widget_values(node, info).items():
                where = f"{t} #{node['id']} {name}"
                if name.endswith(":control_after_generate"):
                    if value not in CONTROL_VALUES:
                        problems.append(f"{where}: {value!r} is not one of {sorted(CONTROL_VALUES)}")
                    continue
                check_value(where, specs[name], value)
        except AssertionError as exc:
            problems.append(str(exc))
        # every required socket (non-widget input) is connected
        for name in info["input_order"].get("required", []):
            spec = specs[name]
            kind = "COMBO" if isinstance(spec[0], list) else spec[0]
            if kind in WIDGET_TYPES and not (len(spec) > 1 and spec[1].get("forceInput")):
                continue
            inp = next((i for i in node.get("inputs", []) if i["name"] == name), None)
            if inp is None or inp.get("link") is None:
                problems.append(f"{t} #{node['id']}: required input {name!r} ({kind}) is not connected")
    for link_id, origin, oslot, target, tslot, ltype in wf["links"]:
        src, dst = g.nodes.get(origin), g.nodes.get(target)
        if src is None or dst is None:
            problems.append(f"link {link_id}: joins a node that does not exist ({origin} -> {target})")
            continue
        s_info, d_info = object_info.get(src["type"]), object_info.get(dst["type"])
        if s_info is None or d_info is None:
            continue
        out_type = s_info["output"][oslot]
        in_name = dst["inputs"][tslot]["name"]
        d_specs = {**d_info["input"].get("required", {}), **d_info["input"].get("optional", {})}
        in_spec = d_specs.get(in_name)
        if in_spec is None:
            problems.append(f"link {link_id}: {dst['type']} has no input {in_name!r}")
            continue
        in_type = "COMBO" if isinstance(in_spec[0], list) else in_spec[0]
        if not (out_type == in_type == ltype or "*" in (out_type, in_type)):
            problems.append(
                f"link {link_id}: {src['type']}.{s_info['output_name'][oslot]} ({out_type}) -> "
                f"{dst['type']}.{in_name} ({in_type}), link says {ltype}"
            )
        if dst["inputs"][tslot].get("link") != link_id:
            problems.append(f"link {link_id}: {dst['type']}.{in_name} does not point back to it")
        if link_id not in (src["outputs"][oslot].get("links") or []):
            problems.append(f"link {link_id}: {src['type']} output {oslot} does not list it")
    return problems


# ------------------------------------------------------------------------------ offline checks
def test_every_workflow_spec_is_shipped():
    names = {p.stem for p in FILES}
    assert names == {spec["name"] for spec in WORKFLOWS}, "run: python tests/web/build_workflows.py"


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_ui_format_and_note_names_every_model_file(path):
    wf = load(path)
    assert wf["version"] == 0.4 and isinstance(wf["nodes"], list) and isinstance(wf["links"], list)
    assert wf["last_node_id"] == max(n["id"] for n in wf["nodes"])
    g = Graph(wf)
    note = g.note_text()
    for t, widgets in MODEL_LOADERS.items():
        for node in g.of_type(t):
            name, folder = node["widgets_values"][0], next(iter(widgets.values()))
            if name in BUNDLED_MODELS.get(folder, ()):
                assert "bundled" in note and "models/tiny_ar" in note, f"the Note does not say where {name} comes from"
                continue
            assert name in MODEL_FILES[folder], f"{t} uses {name!r}, not a file listed in MODEL_FILES[{folder!r}]"
            assert f"models/{folder}/{name}" in note, f"the Note does not say models/{folder}/{name}"
    for node in g.of_type("CLIPLoader"):
        if node["widgets_values"][0] == T5_XXL:
            assert node["widgets_values"][1] == "pixart", "MAGI-1's T5-XXL loads with CLIPLoader type 'pixart'"
        else:
            assert node["widgets_values"][1] == "wan", "the umt5 text encoder loads with CLIPLoader type 'wan'"
    assert g.of_type("SaveAnimatedWEBP"), "each workflow saves a video"
    # Create Video + Save Video read differently across the supported versions (0.33's dynamic format combo)
    assert not g.of_type("SaveVideo") and not g.of_type("CreateVideo")


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_every_model_file_has_an_entry_with_a_url_and_the_folder_its_loader_reads(path):
    """What ComfyUI's missing-models dialog reads (``properties.models``, as core's templates carry it): every file a
    loader names, but for the bundled tiny model, has an entry with its public URL and its ComfyUI folder, the folder
    that loader lists (a loader of another folder, or an entry naming a file no widget names, fails)."""
    wf = load(path)
    bundled = {n for names in BUNDLED_MODELS.values() for n in names}
    named = 0
    for node in wf["nodes"]:
        entries = node.get("properties", {}).get("models", [])
        widgets = MODEL_LOADERS.get(node["type"], {})
        assert entries == [] or widgets, f"{node['type']} carries model entries but is no model loader"
        values = dict(zip(widgets, node.get("widgets_values") or [], strict=False))
        by_name = {e["name"]: e for e in entries}
        others = {c for v in values.values() for c in COMPANIONS.get(v, ())}  # a checkpoint's other shards
        assert {e["name"] for e in entries} <= set(values.values()) | others, (node["type"], entries, values)
        assert others <= set(by_name), f"{node['type']}: the other shards of {values} have no entry"
        for widget, name in values.items():
            if name == NO_LORA:  # Load AR Video Checkpoint's lora_name: no LoRA, no file
                continue
            if name in bundled:
                assert name not in by_name, f"{name} ships with the pack: no download entry"
                continue
            named += 1
            entry = by_name.get(name)
            if not MODEL_SOURCES[name][2]:  # converted first: no download entry, and the Note says how
                assert entry is None, f"{name} is made by tools/convert_checkpoint.py: no download entry"
                notes = " ".join(
                    str(v)
                    for n in wf["nodes"]
                    if n["type"] in ("Note", "MarkdownNote")
                    for v in n.get("widgets_values") or []
                )
                assert "convert_checkpoint.py" in notes, f"{path.name}: {name} needs converting and no Note says how"
                continue
            assert entry is not None, f"{path.name}: {node['type']}.{widget} = {name!r} has no model entry"
            assert set(entry) == {"name", "url", "directory"}, entry
            assert entry["url"].startswith("https://huggingface.co/"), entry
            assert entry["directory"] == widgets[widget], (
                f"{name}: {entry['directory']} is not what {node['type']} reads"
            )
            assert name in MODEL_FILES[entry["directory"]], f"{name} is not a placeholder of {entry['directory']}"
            # the file itself, not a page (the training checkpoints Load AR Video Checkpoint reads are .pt)
            assert entry["url"].endswith((".safetensors", ".sft", ".pt")), entry
    if "tiny" not in path.stem.lower():
        assert named, f"{path.name} names no model file"


def _sampler_widgets(g: Graph, node: dict) -> dict:
    """The sampler's widget values by name."""
    return sampler_widgets(node)


@pytest.mark.parametrize(
    "name,preset,steps",
    [
        ("03 Self-Forcing text to video", "self_forcing_4step", 4),
        ("06 LongLive 30 s text to video", "longlive_4step", 4),
        ("05 CausVid text to video", "causvid_3step", 3),
    ],
)
def test_few_step_workflows_use_their_reference_schedule(name, preset, steps):
    g = Graph(by_name(name))
    (sampler,) = [n for n in g.wf["nodes"] if n["type"] in SAMPLERS]
    assert g.model_chain(sampler)[:2] == ["JensenKVBiasCorrection", "JensenKVQuantizeKVCache"]
    (quant,) = g.of_type("JensenKVQuantizeKVCache")
    assert quant["widgets_values"][:2] == ["2", "2"]
    (jensen,) = g.of_type("JensenKVBiasCorrection")
    assert jensen["widgets_values"][0] == "taylor"
    w = _sampler_widgets(g, sampler)
    assert (w["cfg"], w["chunk_frames"], w["control"]) == (1, 3, "fixed")
    sched = g.upstream(sampler, "sigmas")
    assert sched["type"] == "JensenKVARSchedule" and sched["widgets_values"][0] == preset
    assert g.upstream(sampler, "sampler")["widgets_values"] == ["lcm"]
    note = g.note_text()
    assert {
        "self_forcing_4step": "t = 1000, 937.5, 833.3, 625",
        "longlive_4step": "t = 1000, 937.5, 833.3, 625",
        "causvid_3step": "t = 1000, 757, 522",
    }[preset] in note
    assert "convert_checkpoint.py" in note


def test_the_longlive_workflow_keeps_what_longlive_attends():
    """LongLive 1.0 (configs/longlive_inference.yaml): local_attn_size 12, sink_size 3 latent frames, 3 frames per
    block, 120 latent frames; the sampler's window and sink are what Retention.from_local_attention makes of them,
    and the base is converted with its LoRA merged."""
    from jensen_core.retention import Retention

    g = Graph(by_name("06 LongLive 30 s text to video"))
    (sampler,) = g.of_type("JensenKVChunkedARSampler")
    w = _sampler_widgets(g, sampler)
    rule = Retention.from_local_attention(12, 3, 3)
    assert (w["chunk_frames"], w["window_chunks"], w["sink_chunks"]) == (3, rule.window_chunks, rule.sink_chunks)
    (latent,) = g.of_type("EmptyHunyuanLatentVideo")
    assert (latent["widgets_values"][2] - 1) // 4 + 1 == 120  # num_output_frames: 120 latent frames
    note = g.note_text()
    # --lora merges into the base's generator entry without --key (LongLive's), never generator_ema
    assert "--lora lora.pt" in note and "generator entry" in note and "local_attn_size 12 and sink_size 3" in note


@pytest.mark.parametrize("name", ["06 LongLive 30 s text to video", "16 Story with a prompt schedule"])
def test_prompt_switches_re_cache_as_longlive_does_and_the_note_says_which_is_which(name):
    """LongLive keeps the old prompt's sink on a switch: the workflows re-cache its way, and their Notes call the
    causal mode the pack's own, not LongLive's."""
    g = Graph(by_name(name))
    (sampler,) = g.of_type("JensenKVChunkedARSampler")
    assert _sampler_widgets(g, sampler)["recache_mode"] == "longlive"
    note = g.note_text()
    assert "_recache_after_switch" in note and "sink keeps the old prompt" in note
    assert "causal is the\npack's own re-cache, not LongLive's" in note or "causal is the pack's own" in note.replace(
        "\n", " "
    )


def test_the_causal_forcing_workflow_runs_its_first_frame_on_four_steps():
    """Causal Forcing++ frame-wise 2-step: chunk_frames 1, lcm, the 2-step preset as sigmas and the 4-step one on
    first_chunk_sigmas (the reference's denoising_step_list_first_chunk)."""
    g = Graph(by_name("08 Causal Forcing frame-wise 2-step"))
    (sampler,) = g.of_type("JensenKVChunkedARSampler")
    w = _sampler_widgets(g, sampler)
    assert (w["chunk_frames"], w["cfg"], w["first_chunk_frames"]) == (1, 1, 0)
    assert g.upstream(sampler, "sigmas")["widgets_values"][0] == "causal_forcing_framewise_2step"
    assert g.upstream(sampler, "first_chunk_sigmas")["widgets_values"][0] == "causal_forcing_framewise_4step"
    assert g.upstream(sampler, "sampler")["widgets_values"] == ["lcm"]
    assert g.model_chain(sampler)[:2] == ["JensenKVBiasCorrection", "JensenKVQuantizeKVCache"]
    note = g.note_text()
    assert "t = 1000, 937.5, 833.3, 625" in note and "t = 1000, 833.3" in note and "convert_checkpoint.py" in note


def test_skyreels_uses_cfg_above_1_with_a_real_negative_prompt_and_full_unipc_sigmas():
    g = Graph(by_name("07 SkyReels-V2 DF with cfg 6"))
    (sampler,) = [n for n in g.wf["nodes"] if n["type"] in SAMPLERS]
    assert sampler["type"] == "JensenKVChunkedARSampler", "the KSampler-style node would drop UniPC's penultimate sigma"
    assert _sampler_widgets(g, sampler)["cfg"] > 1, "cfg > 1: both CFG branches cached"
    neg = g.upstream(sampler, "negative")
    assert neg["type"] == "CLIPTextEncode" and neg["widgets_values"][0].strip()
    assert g.model_chain(sampler)[:2] == ["JensenKVBiasCorrection", "JensenKVQuantizeKVCache"]
    assert g.upstream(sampler, "sampler")["widgets_values"] == ["uni_pc_bh2"]
    sched = g.upstream(sampler, "sigmas")
    assert sched["type"] == "BasicScheduler" and sched["widgets_values"][:2] == ["simple", 30]
    assert g.upstream(sched, "model")["type"] == "ModelSamplingSD3"
    note = g.note_text()
    for fact in ("addnoise_condition", "fps embedding", "0.216"):
        assert fact in note, fact


@pytest.mark.parametrize("name", ["07 SkyReels-V2 DF with cfg 6", "18 Extend a clip with SkyReels-V2 DF"])
def test_skyreels_notes_say_it_is_an_experimental_causal_variant_and_the_fps_drop_changes_the_output(name):
    note = " ".join(Graph(by_name(name)).note_text().split())
    for fact in (
        "experimental causal variant of SkyReels-V2 DF",
        "attend bidirectionally",
        "keep no KV cache",
        "re-encode overlap_history frames",
        "to every block's modulation",
        "output differs",
    ):
        assert fact in note, fact
    assert "expected, the T2V path does not use it" not in note


def test_long_video_workflows_wire_what_they_promise():
    story = Graph(by_name("16 Story with a prompt schedule"))
    (sampler,) = [n for n in story.wf["nodes"] if n["type"] in SAMPLERS]
    starts, n = [], story.upstream(sampler, "positive")
    while n is not None and n["type"] == "JensenKVPromptSchedule":
        starts.append(n["widgets_values"][0])
        n = story.upstream(n, "schedule")
    assert sorted(starts) == [0, 5, 10]
    w = _sampler_widgets(story, sampler)
    assert (w["window_chunks"], w["sink_chunks"]) == (6, 1)
    (save,) = story.of_type("JensenKVSaveKVCache")
    assert story.upstream(save, "kv_cache")["id"] == sampler["id"]
    assert STORY_CACHE.split("/")[-1].startswith(save["widgets_values"][0].split("/")[-1])
    cont = Graph(by_name("19 Continue from a saved KV cache"))
    (sampler,) = [n for n in cont.wf["nodes"] if n["type"] in SAMPLERS]
    load = cont.upstream(sampler, "kv_cache")
    assert load["type"] == "JensenKVLoadKVCache" and load["widgets_values"][0] == STORY_CACHE_NAME
    assert STORY_CACHE == STORY_CACHE_NAME + ".safetensors"  # the file Save KV Cache writes, listed without it
    cw = _sampler_widgets(cont, sampler)
    assert (cw["chunk_frames"], cw["window_chunks"], cw["sink_chunks"]) == (3, 6, 1)  # as the story saved it
    for name in ("17 Extend a clip with Self-Forcing", "18 Extend a clip with SkyReels-V2 DF"):
        g = Graph(by_name(name))
        (sampler,) = [n for n in g.wf["nodes"] if n["type"] in SAMPLERS]
        enc = g.upstream(sampler, "prefix")
        assert enc["type"] == "VAEEncode"
        assert g.upstream(g.upstream(g.upstream(enc, "pixels"), "image"), "video")["type"] == "LoadVideo"
        assert _sampler_widgets(g, sampler)["include_prefix"] is True


def test_the_magi1_workflow_samples_the_distilled_4p5b_through_int2_and_jensen():
    """MAGI-1 4.5B distill, text to video: Load MAGI-1 Model -> Quantize KV Cache (INT2) -> Jensen (taylor) -> MAGI-1
    AR Sampler at the reference's window 4 and key ranges 5,4,3,2, decoded by MAGI-1 VAE Decode; T5 through MAGI-1
    Text Encode; the Note names the converter and the memory it saves."""
    g = Graph(by_name("10 MAGI-1 4.5B distill text to video"))
    (sampler,) = g.of_type("JensenKVMagi1ARSampler")
    assert g.model_chain(sampler) == ["JensenKVBiasCorrection", "JensenKVQuantizeKVCache", "JensenKVLoadMagi1"]
    (load,) = g.of_type("JensenKVLoadMagi1")
    assert load["widgets_values"][2] == "distill"
    (quant,) = g.of_type("JensenKVQuantizeKVCache")
    assert quant["widgets_values"][:3] == ["2", "2", "32"]
    assert g.of_type("JensenKVBiasCorrection")[0]["widgets_values"][0] == "taylor"
    names = [k for k in MAGI1_SAMPLER if k != "control_after_generate"]
    names.insert(names.index("seed") + 1, "control")
    w = dict(zip(names, sampler["widgets_values"]))
    assert (w["window_size"], w["kv_ranges"], w["cfg"], w["window_chunks"], w["control"]) == (
        4,
        "5,4,3,2",
        "auto",
        0,
        "fixed",
    )
    assert w["steps"] % (4 * w["window_size"]) == 0 and w["frames"] % 24 == 0  # whole quarters and whole chunks
    assert g.upstream(sampler, "positive")["type"] == "JensenKVMagi1TextEncode"
    decode = g.of_type("JensenKVMagi1VAEDecode")[0]
    assert g.upstream(decode, "samples")["id"] == sampler["id"]
    assert g.upstream(decode, "magi1_vae")["type"] == "JensenKVLoadMagi1VAE"
    note = " ".join(g.note_text().split())
    for fact in ("--magi1 --special-tokens", "model-00002-of-00002.safetensors, each saved under the name above", "special_tokens.npz, beside them", "diffusion_pytorch_model.safetensors of the same repository, as it is", 'type "pixart"', "annealed from 5 to 2",
                 "benchmarks/magi1_memory.py", "A/B baseline"):  # fmt: skip
        assert fact in note, fact


def test_tiny_cpu_demo_runs_three_caches_of_the_bundled_model():
    g = Graph(by_name("01 Tiny AR demo - runs on a CPU, no download"))
    (unet,) = g.of_type("UNETLoader")
    assert unet["widgets_values"][0] == "jensen-kv-tiny-ar.safetensors"
    samplers = [n for n in g.wf["nodes"] if n["type"] in SAMPLERS]
    arms = sorted(tuple(t for t in g.model_chain(s) if t.startswith("JensenKV")) for s in samplers)
    assert arms == [(), ("JensenKVBiasCorrection", "JensenKVQuantizeKVCache"), ("JensenKVQuantizeKVCache",)]
    assert len({tuple(s["widgets_values"]) for s in samplers}) == 1
    assert len(g.of_type("JensenKVTinyARDecode")) == 3 and g.of_type("SaveAnimatedWEBP")
    # each arm drawn by the bundled tiny decoder at Wan's stride (128x128 frames), not the blocky preview colours
    assert [d["widgets_values"] for d in g.of_type("JensenKVTinyARDecode")] == [[8, "tiny decoder"]] * 3
    # issue 41, item 5: the saved picture is labelled panels with a number each (Compare Panels), in the order
    # full precision / INT2 / INT2 + Jensen, and the Note promises nothing the tiny model may not show
    (compare,) = g.of_type("JensenKVComparePanels")
    assert compare["widgets_values"] == ["full precision", "INT2", "INT2 + Jensen"]
    fed = {i["name"]: g.nodes[g.links[i["link"]][1]] for i in compare["inputs"] if i.get("link") is not None}
    assert set(fed) == {"image_a", "image_b", "image_c"}
    arms = {
        k: tuple(t for t in g.model_chain(g.upstream(n, "samples")) if t.startswith("JensenKV")) for k, n in fed.items()
    }
    assert arms == {
        "image_a": (),
        "image_b": ("JensenKVQuantizeKVCache",),
        "image_c": ("JensenKVBiasCorrection", "JensenKVQuantizeKVCache"),
    }
    (save,) = g.of_type("SaveAnimatedWEBP")
    assert g.upstream(save, "images") is compare and not g.of_type("ImageStitch")
    (note,) = [n for n in g.wf["nodes"] if n["type"] == "Note"]
    text = note["widgets_values"][0]
    assert "steal attention" not in text and "PSNR against full precision" in text and "look alike" in text


def test_ab_runs_one_seed_through_bf16_int2_and_int2_jensen_side_by_side():
    g = Graph(by_name("04 Same seed - BF16, INT2, INT2 + Jensen"))
    samplers = [n for n in g.wf["nodes"] if n["type"] in SAMPLERS]
    assert len(samplers) == 3
    assert len({tuple(s["widgets_values"]) for s in samplers}) == 1, "same seed, cfg, chunking for all arms"
    assert all(s["widgets_values"][1] == "fixed" for s in samplers)
    chains = [g.model_chain(s) for s in samplers]
    assert all(c[-1] == "JensenKVLoadARCheckpoint" for c in chains), chains  # one loader, Self-Forcing as published
    arms = sorted(tuple(t for t in c[:-1] if t.startswith("JensenKV")) for c in chains)
    assert arms == [(), ("JensenKVBiasCorrection", "JensenKVQuantizeKVCache"), ("JensenKVQuantizeKVCache",)]
    # all three decoded and stitched into the one saved video
    (save,) = g.of_type("SaveAnimatedWEBP")
    seen, todo = set(), [save]
    while todo:
        n = todo.pop()
        seen.add(n["id"])
        todo += [g.nodes[g.links[i["link"]][1]] for i in n.get("inputs", []) if i.get("link") is not None]
    assert {s["id"] for s in samplers} <= seen
    assert len(g.of_type("ImageStitch")) == 2


# ------------------------------------------------------------------------------ live server
@pytest.fixture(scope="module")
def object_info(comfy_server):
    """/object_info of the session's shared server, with placeholder files so the loaders' combos list the names."""
    write_placeholder_files(comfy_server.base_dir)
    info = comfy_server.get("/object_info")
    info["__templates__"] = comfy_server.get("/api/workflow_templates")
    return info


@pytest.mark.comfyui
@pytest.mark.server
@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_workflow_is_valid_against_live_object_info(path, object_info):
    # with the placeholders written into each model entry's folder (MODEL_FILES), the loaders' combos list them:
    # every model entry names a file its loader really reads from that folder
    assert "JensenKVQuantizeKVCache" in object_info, "the pack's nodes did not load on the server"
    problems = validate(load(path), object_info)
    assert not problems, "\n".join(problems)


@pytest.mark.comfyui
@pytest.mark.server
def test_workflows_saved_before_the_qvg_inputs_keep_their_widgets(object_info):
    """A Quantize KV Cache saved with the six widgets it had before QVG maps them onto the same inputs:
    the new inputs come after them, and each has a default for the front end to fill in."""
    info = object_info["JensenKVQuantizeKVCache"]
    old = ["key_bits", "value_bits", "group_size", "rotation", "scale_format", "rotation_seed"]
    order = [*info["input_order"]["required"], *info["input_order"].get("optional", [])]
    widgets = [n for n in order if n != "model"]
    assert widgets[: len(old)] == old
    specs = {**info["input"]["required"], **info["input"].get("optional", {})}
    new = widgets[len(old) :]
    qvg = ["method", "qvg_stages", "qvg_centroids", "qvg_iters"]
    tiers = ["recent_chunks_bits", "recent_chunks", "sink_bits", "recent_chunks_key_bits"]
    assert new == [*qvg, *tiers, "head_bits", "head_fraction"]  # then tiers, then precision by head
    for name in new:
        assert "default" in specs[name][1], f"{name} needs a default for old workflows"
    assert specs["method"][1]["default"] == "rtn"  # an old workflow keeps plain RTN
    assert specs["recent_chunks_bits"][1]["default"] == specs["sink_bits"][1]["default"] == "off"  # and one precision
    wf = by_name("03 Self-Forcing text to video")
    quant = next(n for n in wf["nodes"] if n["type"] == "JensenKVQuantizeKVCache")
    assert quant["widgets_values"][len(old) : len(old) + len(qvg)] == [specs[n][1]["default"] for n in qvg]
    # such a file is valid: the front end fills the four new widgets with their defaults
    quant["widgets_values"] = quant["widgets_values"][: len(old)]
    assert validate(wf, object_info) == []
    values = widget_values(quant, info)
    assert [values[n] for n in old] == quant["widgets_values"]
    assert [values[n] for n in new] == [specs[n][1]["default"] for n in new]


@pytest.mark.comfyui
@pytest.mark.server
def test_validator_catches_broken_workflows(object_info):
    """The checks above can fail: break a copy of a workflow in each way they look for."""
    wf = by_name("03 Self-Forcing text to video")
    assert validate(wf, object_info) == []

    def broken(mutate):
        w = json.loads(json.dumps(wf))
        mutate(w)
        return " ".join(validate(w, object_info))

    def node(w, t):
        return next(n for n in w["nodes"] if n["type"] == t)

    assert "missing node" in broken(lambda w: node(w, "VAEDecode").update(type="VAEDecodeNope"))
    assert "'5' is not one of" in broken(
        lambda w: node(w, "JensenKVQuantizeKVCache")["widgets_values"].__setitem__(0, "5")
    )
    assert "> max" in broken(lambda w: node(w, "JensenKVBiasCorrection")["widgets_values"].__setitem__(1, 9.0))
    assert "is not one of" in broken(
        lambda w: node(w, "JensenKVLoadARCheckpoint")["widgets_values"].__setitem__(0, "nope.pt")
    )
    assert "left over" in broken(lambda w: node(w, "VAELoader")["widgets_values"].append("x"))
    assert "no widget value for vae_name (a required input)" in broken(
        lambda w: node(w, "VAELoader")["widgets_values"].clear()
    )

    def retype(w):
        w["links"][0][5] = "CLIP"

    assert "link says CLIP" in broken(retype)

    def cut(w):
        s = node(w, "JensenKVChunkedARSampler")
        inp = next(i for i in s["inputs"] if i["name"] == "latent")
        inp["link"] = None

    assert "required input 'latent'" in broken(cut)

    # ComfyUI 0.33's Save Video (a dynamic format combo) is refused; older versions' Save Video is a plain node
    save_specs = object_info["SaveVideo"]["input"]["required"]
    if any(spec[0] in DYNAMIC_WIDGET_TYPES for spec in save_specs.values()):
        assert "dynamic combo" in broken(lambda w: node(w, "SaveAnimatedWEBP").update(type="SaveVideo"))


@pytest.mark.comfyui
@pytest.mark.server
def test_family_loaders_list_no_bundled_tiny_wan_file(object_info):
    """Load MAGI-1 Model and Load HY-WorldPlay list only what can be their own: not the pack's bundled tiny Wan files,
    which Load Diffusion Model lists (HY-WorldPlay's loader exists from v0.27 on)."""

    def options(node, widget):
        spec = object_info[node]["input"]["required"][widget]
        return spec[0] if isinstance(spec[0], list) else spec[1]["options"]

    bundled = set(BUNDLED_MODELS["diffusion_models"])
    assert bundled <= set(options("UNETLoader", "unet_name"))
    # the .pt training checkpoints are Load AR Video Checkpoint's alone (it lists every file, the bundled ones too)
    assert set(MODEL_FILES["diffusion_models"]) | bundled <= set(options("JensenKVLoadARCheckpoint", "ckpt_name"))
    placeholders = {n for n in MODEL_FILES["diffusion_models"] if n.endswith(".safetensors")}
    later_shards = {c for names in COMPANIONS.values() for c in names}  # Load MAGI-1 Model lists a set as its first
    for node, widget in (("JensenKVLoadMagi1", "model_name"), ("JensenKVLoadWorldPlay", "unet_name")):
        if node in object_info:
            listed = set(options(node, widget))
            want = placeholders - later_shards if node == "JensenKVLoadMagi1" else placeholders
            assert not listed & bundled, f"{node} lists {listed & bundled}"
            assert want <= listed, f"{node} lists less than diffusion_models holds: {want - listed}"
            if node == "JensenKVLoadMagi1":
                assert not listed & later_shards, f"{node} lists a set's later shards: {listed & later_shards}"


@pytest.mark.comfyui
@pytest.mark.server
def test_server_offers_the_workflows_as_templates(object_info):
    """ComfyUI lists a pack's example_workflows/ (or example_workflows/) in its template browser."""
    listed = object_info["__templates__"]
    ours = next((v for k, v in listed.items() if k.endswith("comfyui-jensen-kv")), None)
    assert ours is not None, listed
    assert sorted(ours) == sorted(p.stem for p in FILES)


@pytest.mark.comfyui
@pytest.mark.server
def test_planner_defaults_and_ranges_match_the_nodes(object_info):
    """The planner route accepts what the nodes accept and starts where they start."""
    from support.pack import load_pack_module

    routes = load_pack_module("routes.ui")
    q = object_info["JensenKVQuantizeKVCache"]["input"]["required"]
    for name in ("key_bits", "value_bits", "group_size", "rotation", "scale_format"):
        opts = q[name][1]
        assert str(routes.DEFAULTS[name]) == opts["default"], name
    assert [str(g) for g in routes.GROUP_CHOICES] == q["group_size"][1]["options"]
    assert list(routes.BITS_CHOICES) == q["key_bits"][1]["options"]
    o = object_info["JensenKVQuantizeKVCache"]["input"]["optional"]  # precision by age
    for name in ("recent_chunks_bits", "sink_bits"):
        assert (
            routes.DEFAULTS[name] == o[name][1]["default"] and list(routes.TIER_BITS_CHOICES) == o[name][1]["options"]
        )
    name = "recent_chunks_key_bits"
    assert routes.DEFAULTS[name] == o[name][1]["default"] == "same"
    assert list(routes.RECENT_KEY_BITS_CHOICES) == o[name][1]["options"]
    assert routes.DEFAULTS["recent_chunks"] == o["recent_chunks"][1]["default"]
    assert routes._INT_RANGES["recent_chunks"][1] == o["recent_chunks"][1]["max"]
    s = object_info["JensenKVChunkedARSampler"]["input"]["required"]
    for name in ("chunk_frames", "window_chunks"):
        assert routes.DEFAULTS[name] == s[name][1]["default"], name
        lo, hi, _ = routes._INT_RANGES[name]
        assert (lo, hi) == (s[name][1]["min"], s[name][1]["max"]), name
    e = object_info["EmptyHunyuanLatentVideo"]["input"]["required"]
    assert routes._INT_RANGES["width"][:2] == (e["width"][1]["min"], e["width"][1]["max"])
