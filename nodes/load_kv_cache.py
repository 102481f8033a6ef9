"""Load KV Cache: read a saved Chunked AR run state back (from the output or input folder)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import struct

from comfy_api.latest import io, ui

from ..runtime.saved_run import FORMAT, load_saved_run
from .common import CATEGORY, Combo, JensenKVCache, logger

ROOTS = ("output", "input")
SUFFIX = ".safetensors"
MAX_LISTED = 1000
#: at most this many ``.safetensors`` files are looked at per listing (output first, then input)
MAX_EXAMINED = 20000


def _root_dir(root: str) -> str:
    import folder_paths

    return folder_paths.get_output_directory() if root == "output" else folder_paths.get_input_directory()


#: the longest safetensors header a listed file may have (a file claiming more is no cache file Load KV Cache
#: reads: 16 MiB, ~100 bytes per tensor). Safetensors writes ``__metadata__`` first, so the listing reads only
#: as far as the metadata's end: the first 64 KiB, more only for a file whose metadata is longer
LISTING_HEADER_BYTES = 16 << 20
_FIRST_READ = 64 << 10
_METADATA_START = re.compile(rb'\s*\{\s*"__metadata__"\s*:\s*')
_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NOCTTY", 0)

#: real path -> ((device, inode, mtime_ns, size), whether it is a cache file) of every file the last listing saw;
#: rebuilt by every listing, so it never holds more than the folders do
_LISTING_CACHE: dict[str, tuple[tuple[int, int, int, int], bool]] = {}


def _read_upto(fd: int, n: int) -> bytes:
    chunks, left = [], n
    while left > 0:
        block = os.read(fd, min(left, 1 << 20))
        if not block:
            break
        chunks.append(block)
        left -= len(block)
    return b"".join(chunks)


def _header_format(path: str) -> str | None:
    """The ``format`` in the safetensors metadata of the regular file ``path`` (a real path), or None.

    Reads 8 bytes, then the header as far as the metadata's end (64 KiB, at most :data:`LISTING_HEADER_BYTES`
    for a file whose metadata is longer); opens without blocking and without following a
    last symlink, and reads nothing from anything that turns out not to be a regular file (a FIFO or
    device swapped in after the listing's ``stat``)."""
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        raw = _read_upto(fd, 8)
        if len(raw) != 8:
            return None
        n = struct.unpack("<Q", raw)[0]
        if n < 2 or n > LISTING_HEADER_BYTES or 8 + n > st.st_size:
            return None
        data = _read_upto(fd, min(n, _FIRST_READ))
        start = _METADATA_START.match(data)
        if start is None:  # no metadata first: not written by safetensors with metadata, so no cache file
            return None
        decoder = json.JSONDecoder()
        while True:
            try:
                meta, _ = decoder.raw_decode(data.decode("utf-8", errors="replace"), start.end())
                break
            except ValueError:
                if len(data) >= n:
                    return None  # malformed
                data += _read_upto(fd, n - len(data))
        fmt = meta.get("format") if isinstance(meta, dict) else None
        return fmt if isinstance(fmt, str) else None
    except (OSError, ValueError, RecursionError):
        return None
    finally:
        os.close(fd)


def _safetensors_files(base: str):
    """(path, real path, stat) of every ``.safetensors`` under the real folder ``base`` that is a regular file
    whose real path is inside ``base``: symlinks are followed only to check that (a symlinked folder is not
    entered), FIFOs, devices and sockets are skipped without being opened. Sorted, depth first."""
    stack = [base]
    while stack:
        folder = stack.pop()
        try:
            with os.scandir(folder) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError:
            continue
        subfolders = []
        for e in entries:
            try:
                if e.is_dir(follow_symlinks=False):
                    subfolders.append(e.path)
                    continue
                if not e.name.endswith(".safetensors"):
                    continue
                if e.is_symlink():
                    real = os.path.realpath(e.path)
                    if os.path.commonpath((base, real)) != base:
                        continue  # points outside the folder
                    st = os.stat(real)
                else:
                    real, st = e.path, e.stat(follow_symlinks=False)
            except (OSError, ValueError):
                continue
            if stat.S_ISREG(st.st_mode):
                yield e.path, real, st
        stack.extend(reversed(subfolders))


def list_cache_files() -> list[str]:
    """``output/...`` and ``input/...`` names of the Jensen KV cache files ComfyUI's folders hold, without their
    ``.safetensors``: the front end takes a combo value ending in a model extension for a model file and lists a
    missing one under "Missing Models", in folder "Unknown" (a saved cache is a run's output, not a model to
    download). :func:`resolve` reads either form, so workflows saved with the extension still load.

    Runs on ComfyUI's event loop (every ``/object_info`` and ``/prompt`` builds the combo), so it must
    never block: only regular files whose real path is inside the folder are considered, only the start of
    their header is read (see :func:`_header_format`), and the answer per file is kept until its
    (device, inode, mtime, size) changes, so a listing of unchanged folders opens no file at all."""
    global _LISTING_CACHE
    previous, seen, found = _LISTING_CACHE, {}, []
    for root in ROOTS:
        base = os.path.realpath(_root_dir(root))
        for path, real, st in _safetensors_files(base):
            key = (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)
            cached = seen.get(real) or previous.get(real)
            is_cache = cached[1] if cached is not None and cached[0] == key else _header_format(real) == FORMAT
            seen[real] = (key, is_cache)
            if is_cache:
                found.append(f"{root}/{os.path.relpath(path, base)[: -len(SUFFIX)]}")
                if len(found) >= MAX_LISTED:
                    break
            if len(seen) >= MAX_EXAMINED:
                break
        if len(found) >= MAX_LISTED or len(seen) >= MAX_EXAMINED:
            break
    _LISTING_CACHE = seen
    return sorted(found)


def resolve(name: str) -> str:
    """The file behind a listed name (``.safetensors`` added where the name has none, as the list shows them);
    refuses anything outside ComfyUI's output and input folders."""
    root, _, rel = str(name).partition("/")
    if root not in ROOTS or not rel:
        raise ValueError(f"cache_file {name!r} must be a listed name starting with output/ or input/")
    base = os.path.realpath(_root_dir(root))
    if os.path.isfile(os.path.join(base, rel + SUFFIX)) or not rel.endswith(SUFFIX):
        rel += SUFFIX  # the listed form; a name with the extension (a workflow saved before) is the file itself
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
            description=(
                "Load a KV cache saved by Save KV Cache and continue that video: connect it to a Chunked AR "
                "sampler's kv_cache input (same model, Quantize KV Cache, chunk length, window, sink and "
                "video size; anything else is refused with the reason)."
            ),
            inputs=[
                Combo(
                    "cache_file",
                    options=files or ["(no saved KV cache yet)"],
                    tooltip="A KV cache Save KV Cache wrote, in ComfyUI's output or input folder (listed without "
                    "its .safetensors).",
                ),
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
        import comfy.model_management

        state = load_saved_run(
            resolve(cache_file), check_interrupt=comfy.model_management.throw_exception_if_processing_interrupted
        )
        text = f"{cache_file}: {state.describe()}"
        logger.info("jensen_kv: loaded %s", text)
        return io.NodeOutput(state, text, ui=ui.PreviewText(text))
