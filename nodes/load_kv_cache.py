"""Load KV Cache: read a saved Chunked AR run state back (from the output or input folder)."""
from __future__ import annotations

import hashlib
import os

from comfy_api.latest import io, ui

from ..runtime.run_state import FORMAT, load_run_state
from .common import CATEGORY, JensenKVCache, logger

ROOTS = ("output", "input")
MAX_LISTED = 1000


def _root_dir(root: str) -> str:
    import folder_paths

    return folder_paths.get_output_directory() if root == "output" else folder_paths.get_input_directory()


def _is_cache_file(path: str) -> bool:
    try:
        from safetensors import safe_open

        with safe_open(path, framework="pt") as f:
            return (f.metadata() or {}).get("format") == FORMAT
    except Exception:  # noqa: BLE001 - anything unreadable is simply not listed
        return False


def list_cache_files() -> list[str]:
    """``output/...`` and ``input/...`` names of the Jensen KV cache files ComfyUI's folders hold."""
    found = []
    for root in ROOTS:
        base = _root_dir(root)
        for dirpath, _, files in os.walk(base):
            for f in sorted(files):
                if f.endswith(".safetensors"):
                    full = os.path.join(dirpath, f)
                    if _is_cache_file(full):
                        found.append(f"{root}/{os.path.relpath(full, base)}")
                if len(found) >= MAX_LISTED:
                    return sorted(found)
    return sorted(found)


def resolve(name: str) -> str:
    """The file behind a listed name; refuses anything outside ComfyUI's output and input folders."""
    root, _, rel = str(name).partition("/")
    if root not in ROOTS or not rel:
        raise ValueError(f"cache_file {name!r} must be a listed name starting with output/ or input/")
    base = os.path.realpath(_root_dir(root))
    path = os.path.realpath(os.path.join(base, rel))
    if os.path.commonpath((base, path)) != base:
        raise ValueError(f"cache_file {name!r} points outside ComfyUI's {root} folder")
    if not os.path.isfile(path):
        raise ValueError(f"cache_file {name!r} does not exist (any more); press R to refresh the list")
    return path


class JensenKVLoadKVCache(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        files = list_cache_files()
        return io.Schema(
            node_id="JensenKVLoadKVCache",
            display_name="Load KV Cache",
            category=CATEGORY,
            description=("Load a KV cache saved by Save KV Cache and continue that video: connect it to a Chunked AR "
                         "sampler's kv_cache input (same model, Quantize KV Cache, chunk length, window, sink and "
                         "video size; anything else is refused with the reason)."),
            inputs=[
                io.Combo.Input("cache_file", options=files or ["(no saved KV cache yet)"],
                               tooltip="A .safetensors file written by Save KV Cache, in ComfyUI's output or input folder."),
            ],
            outputs=[
                JensenKVCache.Output(display_name="kv_cache", tooltip="The saved run state."),
                io.String.Output(display_name="info", tooltip="What the file holds."),
            ],
        )

    @classmethod
    def fingerprint_inputs(cls, cache_file):
        try:
            path = resolve(cache_file)
        except ValueError:
            return cache_file
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        return h.hexdigest()

    @classmethod
    def validate_inputs(cls, cache_file):
        try:
            resolve(cache_file)
        except ValueError as exc:
            return str(exc)
        return True

    @classmethod
    def execute(cls, cache_file) -> io.NodeOutput:
        state = load_run_state(resolve(cache_file))
        text = f"{cache_file}: {state.describe()}"
        logger.info("jensen_kv: loaded %s", text)
        return io.NodeOutput(state, text, ui=ui.PreviewText(text))
