"""Shared bits of the node schemas: category, the report link type, advanced inputs, node messages."""

from __future__ import annotations

import importlib.util
import inspect
import logging
import os
from pathlib import Path

from comfy_api.latest import io, ui

from ..runtime.model_loading import folder_version, is_model_folder, model_folders

logger = logging.getLogger("jensen_kv")

CATEGORY = "jensen_kv"

#: The link type of the Chunked AR sampler's report (a dict, see ``runtime.report.build_report``).
JensenKVReport = io.Custom("JENSEN_KV_REPORT")

#: The state of a Chunked AR run to continue later (``runtime.saved_run.SavedRun``): sampler output and input,
#: Save KV Cache / Load KV Cache.
JensenKVCache = io.Custom("JENSEN_KV_CACHE")

#: A checked HY-WorldPlay camera path (``runtime.families.worldplay.model.trajectory.Trajectory``): HY-WorldPlay Trajectory's output.
WorldPlayTrajectory = io.Custom("WORLDPLAY_TRAJECTORY")

UI_REPORT_KEY = "jensen_kv_report"


def output_connected(node_cls, output_index: int) -> bool:
    """Whether any node of the running prompt takes output ``output_index`` of this node (hidden prompt + id).

    Unknown (no prompt, e.g. called outside a server) counts as connected, so nothing is lost.
    """
    hidden = getattr(node_cls, "hidden", None)
    prompt, node_id = getattr(hidden, "prompt", None), getattr(hidden, "unique_id", None)
    if not isinstance(prompt, dict) or node_id is None:
        return True
    for node in prompt.values():
        for value in (node.get("inputs") or {}).values():
            if (
                isinstance(value, list)
                and len(value) == 2
                and str(value[0]) == str(node_id)
                and value[1] == output_index
            ):
                return True
    return False


def patched_model(model, setting, put, text: str | None = None) -> io.NodeOutput:
    """A MODEL-patching node's output: a clone of ``model`` carrying ``setting`` (``put(clone, setting)``), the pack's
    attention attached (core's AR path reads it there); ``text`` (what the clone now does) is logged and shown on the
    node. The input model is never changed."""
    from ..runtime.core_ar import attach

    m = model.clone()
    put(m, setting)
    attach(m)
    if text is None:
        return io.NodeOutput(m)
    logger.info("jensen_kv: %s", text)
    return io.NodeOutput(m, ui=ui.PreviewText(text))


def advanced(inp: io.Input) -> io.Input:
    """Mark an input as an expert knob: ``advanced=True`` where this ComfyUI knows it, else in the schema dict."""
    if "advanced" in inspect.signature(type(inp).__init__).parameters or hasattr(inp, "advanced"):
        inp.advanced = True
    inp.extra_dict["advanced"] = True
    return inp


def keeps_ui() -> dict:
    """``io.Schema`` keywords that make ComfyUI keep a node's ui output (its report) like an output node's: resent
    on a cached rerun and restored with the workflow (``has_intermediate_output``, v0.27+); nothing on a ComfyUI
    whose schema lacks the field (v0.3.64), where the report shows after a run that executes the node."""
    return {"has_intermediate_output": True} if "has_intermediate_output" in io.Schema.__dataclass_fields__ else {}


def node_message(node_cls, text: str) -> None:
    """Show ``text`` on the running node in the UI (no-op outside a server)."""
    node_id = getattr(getattr(node_cls, "hidden", None), "unique_id", None)
    if node_id is None:
        return
    try:
        from server import PromptServer

        server = getattr(PromptServer, "instance", None)
        if server is not None:
            server.send_progress_text(text, node_id)
    except Exception:  # noqa: BLE001 - a UI nicety must never fail the node
        logger.debug("jensen_kv: could not send progress text", exc_info=True)


def comfyui_checks_v3_combos() -> bool:
    """Whether this ComfyUI's prompt validation checks a V3 ``io.Combo`` value against its options itself.

    v0.27 and newer do (``execution.validate_inputs``: ``input_type == io.Combo.io_type``); v0.3.64 checks only
    V1 list combos. Read from execution.py's text, not imported (it imports ComfyUI's ``nodes``); unknown counts as
    checked (a newer ComfyUI).
    """
    global _CHECKS_V3_COMBOS
    if _CHECKS_V3_COMBOS is None:
        try:
            spec = importlib.util.find_spec("execution")
            text = Path(spec.origin).read_text(encoding="utf-8") if spec and spec.origin else ""
        except (ImportError, OSError, ValueError):
            text = ""
        _CHECKS_V3_COMBOS = not text or "Combo.io_type" in text
    return _CHECKS_V3_COMBOS


_CHECKS_V3_COMBOS: bool | None = None


class Combo(io.Combo.Input):
    """A dropdown that ComfyUI's own validation checks on every version: one bad value is one
    ``value_not_in_list`` error, on that input.

    ComfyUI attaches a ``validate_inputs`` failure to *every* input its signature names (and skips its own checks
    of those), so a node that checked all its combos there showed one bad value as one error per input. On a
    ComfyUI that does not check V3 combos (v0.3.64) this input is published as a V1 list combo, which it checks;
    newer ones get the V3 ``COMBO`` type as before.
    """

    def get_io_type(self):
        if comfyui_checks_v3_combos():
            return super().get_io_type()
        return list(self.options)


#: the pack's bundled tiny AR models (Wan 2.1 files, listed by Load Diffusion Model through diffusion_models)
BUNDLED_MODELS_DIR = Path(__file__).resolve().parent.parent / "models" / "tiny_ar"


def without_bundled(names: list[str], kind: str = "diffusion_models") -> list[str]:
    """``names`` from ComfyUI's ``kind`` list less the pack's bundled tiny Wan files: a loader of another family
    (MAGI-1, HY-WorldPlay) lists only files that can be its own."""
    import folder_paths

    bundled = BUNDLED_MODELS_DIR.resolve()
    kept = []
    for name in names:
        path = folder_paths.get_full_path(kind, name)
        if path is None or bundled not in Path(path).resolve().parents:
            kept.append(name)
    return kept


def diffusion_model_files() -> list[str]:
    """The files of ComfyUI's models/diffusion_models a loader node offers (the pack's bundled ones left out)."""
    import folder_paths

    return without_bundled(folder_paths.get_filename_list("diffusion_models"))


def diffusion_model_path(name: str) -> str:
    """The file behind a listed name, or for a name ending in ``/`` the diffusers folder (inside one of ComfyUI's
    diffusion_models folders, never outside)."""
    import folder_paths

    if not name.endswith("/"):
        return folder_paths.get_full_path_or_raise("diffusion_models", name)
    for base in folder_paths.get_folder_paths("diffusion_models"):
        base = os.path.realpath(base)
        path = os.path.realpath(os.path.join(base, name))
        if os.path.commonpath((base, path)) == base and is_model_folder(path):
            return path
    raise FileNotFoundError(f"{name!r} is no model folder in ComfyUI's models/diffusion_models; press R to refresh")


def diffusion_models_with_folders(accept) -> list[str]:
    """A loader's list: the diffusers folders ``accept`` takes (``name/``, :func:`runtime.model_loading.model_folders`)
    and the files of :func:`diffusion_model_files` less those inside any diffusers folder (shards, never loaded
    alone)."""
    import folder_paths

    every = model_folders(folder_paths.get_folder_paths("diffusion_models"), lambda _: True)
    folders = [d for d in every if accept(diffusion_model_path(d))]
    files = [f for f in diffusion_model_files() if not any(f.replace(os.sep, "/").startswith(d) for d in every)]
    return folders + files


def model_file_fingerprint(unet_name: str, weight_dtype: str) -> str:
    """A loader node's ``fingerprint_inputs``: the file's name, size and modification time (a folder's files'),
    and the dtype."""
    try:
        path = diffusion_model_path(unet_name)
        if os.path.isdir(path):
            return f"{unet_name}|{weight_dtype}|{folder_version(path)}"
        st = os.stat(path)
    except Exception:  # noqa: BLE001 - an unknown name is validate_inputs' to report
        return f"{unet_name}|{weight_dtype}"
    return f"{unet_name}|{weight_dtype}|{st.st_size}|{st.st_mtime_ns}"


def check_model_file(unet_name, no_files: str, put_it_there: str, listed=None):
    """A loader node's ``validate_inputs`` of ``unet_name``: True, or what to do (``put_it_there`` where the list
    is empty, ``no_files`` being its placeholder). ``listed``: the node's own list (default the files)."""
    if unet_name == no_files:
        return put_it_there
    if unet_name is not None and unet_name not in (diffusion_model_files() if listed is None else listed()):
        return f"{unet_name!r} is not in ComfyUI's models/diffusion_models: put it there and press R"
    return True


def sampled_output(latent: dict, result, text: str, *more) -> io.NodeOutput:
    """A sampler node's outputs: ``latent`` with ``result.samples`` as its samples, ``result.report`` (shown on the
    node by web/jensen_kv.js from the ui payload, ``text`` logged) and ``more``."""
    out = latent.copy()
    out.pop("downscale_ratio_spacial", None)
    out["samples"] = result.samples
    logger.info("jensen_kv: %s", text.replace("\n", " "))
    return io.NodeOutput(out, result.report, *more, ui={UI_REPORT_KEY: [result.report], "text": [text]})
