"""Which MAGI-1 checkpoints ComfyUI's model folders hold: single files and Sand AI's sharded folders."""

from __future__ import annotations

import os

from .model.checkpoint import INDEX, SHARD_NAME, SPECIAL_NPZ, VAE_CONFIG, VAE_FILE, shard_paths

#: how deep below a model folder a sharded checkpoint folder is looked for (ckpt/magi/4.5B_base/inference_weight)
MAX_DEPTH = 4
MAX_LISTED = 2000


def _bases(kind: str) -> list[str]:
    import folder_paths

    try:
        return [p for p in folder_paths.get_folder_paths(kind) if os.path.isdir(p)]
    except KeyError:
        return []


def _is_checkpoint_folder(kind: str, files) -> bool:
    if kind == "vae":
        return VAE_CONFIG in files and (VAE_FILE in files or INDEX in files)
    return INDEX in files


def sharded_folders(kind: str = "diffusion_models") -> list[str]:
    """Folders (relative, ending in ``/``) under ComfyUI's ``kind`` folders that hold a checkpoint in Sand AI's
    layout: a safetensors index and its shards (the DiT), or ``config.json`` + ``diffusion_pytorch_model`` (the VAE)."""
    found = set()
    for base in _bases(kind):
        base = os.path.realpath(base)
        for root, dirs, files in os.walk(base, followlinks=True):
            depth = os.path.relpath(root, base).count(os.sep) + (root != base)
            if depth >= MAX_DEPTH:
                dirs[:] = []
            if root != base and _is_checkpoint_folder(kind, files):
                found.add(os.path.relpath(root, base).replace(os.sep, "/") + "/")
            if len(found) >= MAX_LISTED:
                break
    return sorted(found)


def _later_shard(name: str) -> bool:
    """A shard other than the first of a checkpoint downloaded file by file (the list shows a set as its shard 1)."""
    m = SHARD_NAME.match(os.path.basename(name))
    return m is not None and int(m["i"]) != 1


def choices(kind: str = "diffusion_models") -> list[str]:
    """The loader's list: sharded folders (``name/``) and the single files ComfyUI lists, shards left out (a set of
    shards saved side by side, ``<stem>-0000k-of-0000N.safetensors``, is listed as its first)."""
    import folder_paths

    folders = sharded_folders(kind)
    files = [
        f
        for f in folder_paths.get_filename_list(kind)
        if f.endswith((".safetensors", ".sft"))
        and not any(f.replace(os.sep, "/").startswith(d) for d in folders)
        and not _later_shard(f)
    ]
    return folders + sorted(files)


def resolve(name: str, kind: str = "diffusion_models") -> str:
    """The file or folder behind a listed name (inside one of ComfyUI's ``kind`` folders, never outside)."""
    import folder_paths

    if not name.endswith("/"):
        return folder_paths.get_full_path_or_raise(kind, name)
    for base in _bases(kind):
        base = os.path.realpath(base)
        path = os.path.realpath(os.path.join(base, name))
        if (
            os.path.commonpath((base, path)) == base
            and os.path.isdir(path)
            and _is_checkpoint_folder(kind, os.listdir(path))
        ):
            return path
    raise ValueError(
        f"{name!r} is no MAGI-1 checkpoint folder in ComfyUI's {kind} folders; press R to refresh the list"
    )


def version(path: str) -> str:
    """Sizes and modification times of the checkpoint's files (what a loader's fingerprint changes with): a folder's
    files; a file, the shards of its set and a ``special_tokens.npz`` beside it (a shard or the tokens put there
    later load afresh)."""
    paths = [path]
    if os.path.isdir(path):
        paths = sorted(os.path.join(path, f) for f in os.listdir(path))
    else:
        paths = [str(p) for p in shard_paths(path) or [path]]
        paths.append(os.path.join(os.path.dirname(path), SPECIAL_NPZ))
    parts = []
    for p in paths:
        try:
            st = os.stat(p)
        except OSError:
            continue
        parts.append(f"{os.path.basename(p)}:{st.st_size}:{st.st_mtime_ns}")
    return "|".join(parts)
