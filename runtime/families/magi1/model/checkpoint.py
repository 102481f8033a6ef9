"""Finding, checking and reading MAGI-1 checkpoints: a single safetensors file, or Sand AI's folders.

Sand AI publishes (``inference/infra/checkpoint/checkpointing.py``, huggingface sand-ai/MAGI-1 ``ckpt/``):

- the DiT as ``<model>/inference_weight[.fp8][.distill]/model.safetensors``, or a
  ``model.safetensors.index.json`` with shards ``model-0000N-of-0000M.safetensors``; a shard may be stored
  zstd-compressed as ``<shard>.zst`` (the reference decompresses it in memory at load time);
- the VAE as ``ckpt/vae/config.json`` + ``diffusion_pytorch_model.safetensors``;
- ``*_distill_quant`` (``inference_weight.fp8.distill``): per-tensor fp8 weights of shape (1, out, in) with
  ``weight_scale`` / ``input_scale`` / ``smooth_scale``, evaluated by flashinfer's ``bmm_fp8``.

Only headers are read until the weights are wanted; every refusal names the file and the way on.
Converted files (``tools/convert_checkpoint.py``) carry the architecture as the metadata entry
``magi1_config`` (JSON of :class:`runtime.families.magi1.model.config.MagiConfig`) and the caption's special tokens as
``special_tokens.<NAME>`` tensors.
"""

from __future__ import annotations

import json
import os
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .caption import PREFIX as SPECIAL_PREFIX
from .config import FP8_QUANT_REFUSAL, ConfigError, MagiConfig, config_from_shapes, expected_shapes

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
#: Sand AI's caption tokens as published (``example/assets/special_tokens.npz`` of github SandAI-org/MAGI-1), read when
#: found beside a checkpoint that does not carry them
SPECIAL_NPZ = "special_tokens.npz"
#: one shard of a checkpoint downloaded file by file: ``<stem>-0000k-of-0000N.safetensors`` (Sand AI's shards saved
#: under a name of the user's, e.g. ``magi1_4.5b_distill-00001-of-00002.safetensors``), no index needed
MAX_SHARDS = 1000
SHARD_NAME = re.compile(r"^(?P<stem>.+)-(?P<i>\d{5})-of-(?P<n>\d{5})\.safetensors$")
VAE_FILE = "diffusion_pytorch_model.safetensors"
VAE_CONFIG = "config.json"
META_CONFIG = "magi1_config"
META_VAE_CONFIG = "magi1_vae_config"
#: the key every MAGI-1 DiT has (what tells it from other models)
PROBE_KEY = "videodit_blocks.layers.0.self_attention.linear_qkv.q.weight"
QUANT_SUFFIXES = (".weight_scale", ".input_scale", ".smooth_scale")
MAX_HEADER = 100 << 20
ST_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}


class CheckpointError(ValueError):
    """A file or folder that is not a MAGI-1 checkpoint this pack reads (the message says why and what to do)."""


class NotMagiError(CheckpointError):
    """The file holds some other model."""


class ZstShardError(CheckpointError):
    """Sand AI's zstd-compressed shards (``*.safetensors.zst``)."""


class QuantizedCheckpointError(CheckpointError):
    """Sand AI's ``distill_quant`` fp8 weights (flashinfer's per-tensor fp8 matmul)."""


def zst_refusal(path: Path) -> str:
    return (
        f"{path} is a zstd-compressed shard (Sand AI stores some as .safetensors.zst and decompresses them in "
        "memory at load time); this pack reads plain safetensors only. Decompress it first, e.g. "
        f"`zstd -d --keep {path.name}` in {path.parent}, then load the folder or convert it with "
        "tools/convert_checkpoint.py --magi1"
    )


def read_header(path: Path) -> tuple[dict, int]:
    """(JSON header, offset of the data) of a safetensors file, validated (entries, dtypes, offsets in the file)."""
    path = Path(path)
    if path.suffix == ".zst" or (not path.exists() and Path(str(path) + ".zst").exists()):
        raise ZstShardError(zst_refusal(path if path.suffix == ".zst" else Path(str(path) + ".zst")))
    if not path.is_file():
        raise CheckpointError(f"{path} does not exist or is not a file")
    size = path.stat().st_size
    with open(path, "rb") as f:
        raw = f.read(8)
        n = struct.unpack("<Q", raw)[0] if len(raw) == 8 else -1
        if n < 2 or 8 + n > size or n > MAX_HEADER:
            raise CheckpointError(f"{path} is not a safetensors file (header length {n}, file size {size})")
        try:
            header = json.loads(f.read(n).decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as e:
            raise CheckpointError(f"{path} is not a safetensors file (its header: {e})") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path} is not a safetensors file (its header is no JSON object)")
    data = size - 8 - n
    for name, info in header.items():
        if name == "__metadata__":
            if not isinstance(info, dict):
                raise CheckpointError(f"{path}: __metadata__ is not an object")
            continue
        if not isinstance(info, dict) or info.get("dtype") not in ST_DTYPES:
            raise CheckpointError(f"{path}: tensor {name[:100]!r} has no known dtype ({str(info)[:100]})")
        shape, offs = info.get("shape"), info.get("data_offsets")
        if not (
            isinstance(shape, list)
            and all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x < 2**40 for x in shape)
        ):
            raise CheckpointError(f"{path}: tensor {name[:100]!r} has the shape {str(shape)[:100]}")
        if not (
            isinstance(offs, list)
            and len(offs) == 2
            and all(isinstance(x, int) for x in offs)
            and 0 <= offs[0] <= offs[1] <= data
        ):
            raise CheckpointError(f"{path}: tensor {name[:100]!r} lies outside the file ({str(offs)[:100]})")
        numel = 1
        for x in shape:
            numel *= x
        if offs[1] - offs[0] != numel * ST_DTYPES[info["dtype"]].itemsize:
            raise CheckpointError(f"{path}: tensor {name[:100]!r} claims {offs[1] - offs[0]} bytes for shape {shape}")
    return header, 8 + n


@dataclass
class Files:
    """Which file holds each tensor, the files' metadata (merged) and their headers' shapes and dtypes."""

    root: Path
    where: dict[str, Path] = field(default_factory=dict)
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    dtypes: dict[str, str] = field(default_factory=dict)
    metadata: dict[str, str] = field(default_factory=dict)

    @property
    def files(self) -> list[Path]:
        return sorted(set(self.where.values()))

    def nbytes(self) -> int:
        return sum(p.stat().st_size for p in self.files)


def _add_file(files: Files, path: Path, only: set[str] | None = None) -> None:
    header, _ = read_header(path)
    meta = header.get("__metadata__") or {}
    files.metadata.update({str(k): str(v) for k, v in meta.items()})
    for name, info in header.items():
        if name == "__metadata__" or (only is not None and name not in only):
            continue
        if name in files.where:
            raise CheckpointError(f"{name!r} is in both {files.where[name].name} and {path.name}")
        files.where[name] = path
        files.shapes[name] = tuple(info["shape"])
        files.dtypes[name] = info["dtype"]
    if only is not None:
        absent = sorted(only - {n for n in header if n != "__metadata__"})
        if absent:
            raise CheckpointError(
                f"{path.name}: the index lists {len(absent)} tensors it does not hold, e.g. {absent[:3]}"
            )


def _read_index(index: Path) -> dict[str, list[str]]:
    try:
        data = json.loads(index.read_text())
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{index}: not a readable JSON index ({e})") from None
    wmap = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(wmap, dict) or not wmap:
        raise CheckpointError(f"{index}: no weight_map (a safetensors index maps each tensor to its shard)")
    shards: dict[str, list[str]] = {}
    for name, shard in wmap.items():
        if not isinstance(shard, str) or not isinstance(name, str):
            raise CheckpointError(
                f"{index}: weight_map entry {str(name)[:80]!r} -> {str(shard)[:80]!r} is not a file name"
            )
        if os.path.basename(shard) != shard or shard in ("", ".", "..") or not shard.endswith((".safetensors", ".zst")):
            raise CheckpointError(f"{index}: shard {shard[:120]!r} is not a .safetensors file name inside the folder")
        shards.setdefault(shard, []).append(name)
    return shards


def shard_paths(path: str | os.PathLike) -> list[Path] | None:
    """Every shard's path of the set ``path`` names (``<stem>-0000k-of-0000N.safetensors``, k = 1 .. N, in ``path``'s
    folder, there or not), or None for a file named otherwise or no shard of a set this loader reads."""
    path = Path(path)
    m = SHARD_NAME.match(path.name)
    if m is None or not 1 <= int(m["i"]) <= int(m["n"]) <= MAX_SHARDS:
        return None
    return [path.with_name(f"{m['stem']}-{k:05d}-of-{m['n']}.safetensors") for k in range(1, int(m["n"]) + 1)]


def shard_set(path: str | os.PathLike) -> list[Path] | None:
    """The files of the checkpoint whose shard ``path`` is (:func:`shard_paths`), or None for a file named otherwise.
    Raises :class:`CheckpointError` naming the shards that are not there."""
    path = Path(path)
    m = SHARD_NAME.match(path.name)
    if m is None:
        return None
    n = int(m["n"])
    shards = shard_paths(path)
    if shards is None:
        raise CheckpointError(
            f"{path.name}: shard {int(m['i'])} of {n} is no shard of a checkpoint this loader reads (1 to "
            f"{MAX_SHARDS} shards)"
        )
    absent = [p.name for p in shards if not p.is_file()]
    if absent:
        raise CheckpointError(
            f"{path.name} is one of {n} shards, and {', '.join(absent)} {'is' if len(absent) == 1 else 'are'} not "
            f"beside it in {path.parent}: download every shard of the checkpoint (Sand AI's "
            "ckpt/magi/<model>/inference_weight[.distill]/model-0000k-of-0000N.safetensors) into that folder, each saved "
            f"as {m['stem']}-0000k-of-{m['n']}.safetensors"
        )
    return shards


def locate(path: str | os.PathLike, single_name: str = SINGLE) -> Files:
    """The tensors of a checkpoint: a ``.safetensors`` file (every shard of its set, for a shard: :func:`shard_set`),
    or a folder with an index and shards or one file."""
    path = Path(path)
    shards = shard_set(path) if path.is_file() else None
    if shards is not None:
        files = Files(path.parent)
        for shard in shards:
            _add_file(files, shard)
        return files
    if path.is_file() or path.suffix == ".zst":
        files = Files(path.parent)
        _add_file(files, path)
        return files
    if not path.is_dir():
        raise CheckpointError(f"{path} is neither a safetensors file nor a checkpoint folder")
    files = Files(path)
    index = path / INDEX
    if index.is_file():
        shards = _read_index(index)
        zst = [s for s in shards if s.endswith(".zst") or (not (path / s).exists() and (path / (s + ".zst")).exists())]
        if zst:
            raise ZstShardError(zst_refusal(path / (zst[0] if zst[0].endswith(".zst") else zst[0] + ".zst")))
        for shard, names in sorted(shards.items()):
            _add_file(files, path / shard, set(names))
        return files
    for name in (single_name, SINGLE, VAE_FILE):
        if (path / name).is_file() or (path / (name + ".zst")).is_file():
            _add_file(files, path / name)
            return files
    raise CheckpointError(
        f"{path}: no {INDEX}, {SINGLE} or {VAE_FILE} in the folder (a MAGI-1 DiT folder is "
        "ckpt/magi/<model>/inference_weight[.distill]/, the VAE's ckpt/vae/)"
    )


def load_tensors(files: Files, names=None, device="cpu") -> dict[str, torch.Tensor]:
    """The named tensors (default: all) read from their files."""
    from safetensors import safe_open

    names = sorted(files.where) if names is None else list(names)
    by_file: dict[Path, list[str]] = {}
    for n in names:
        by_file.setdefault(files.where[n], []).append(n)
    out = {}
    for path, keys in by_file.items():
        with safe_open(str(path), framework="pt", device=str(device)) as f:
            for k in keys:
                out[k] = f.get_tensor(k)
    return out


# ---------------------------------------------------------------------------------------------- the DiT
@dataclass
class DitCheckpoint:
    files: Files
    config: MagiConfig
    special_tokens: list[str]
    variant_from: str  # where base / distill came from
    #: the caption tokens of a ``special_tokens.npz`` found beside a checkpoint that carries none (:func:`npz_beside`)
    special_npz: Path | None = None

    def state_dict(self, device="cpu") -> dict[str, torch.Tensor]:
        return load_tensors(self.files, sorted(expected_shapes(self.config)), device)

    def special(self, device="cpu") -> dict[str, torch.Tensor]:
        if not self.special_tokens and self.special_npz is not None:
            return {k: v.to(device) for k, v in read_special_npz(self.special_npz).items()}
        t = load_tensors(self.files, self.special_tokens, device)
        return {k[len(SPECIAL_PREFIX) :]: v.float().reshape(-1) for k, v in t.items()}


def read_special_npz(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """The caption's special tokens of Sand AI's ``special_tokens.npz`` (no pickles read), as the reference uses them
    (:func:`runtime.families.magi1.model.caption.special_tokens_from_arrays`)."""
    import numpy as np

    from .caption import special_tokens_from_arrays

    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
        return special_tokens_from_arrays(arrays)
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{path}: not Sand AI's special_tokens.npz ({e})") from None


def npz_beside(path: str | os.PathLike) -> Path | None:
    """``special_tokens.npz`` in a checkpoint folder, or beside a checkpoint file (None where there is none)."""
    path = Path(path)
    found = (path if path.is_dir() else path.parent) / SPECIAL_NPZ
    return found if found.is_file() else None


def _describe(names) -> str:
    tops = sorted({n.split(".")[0] for n in names})
    return ", ".join(tops[:8]) + (" ..." if len(tops) > 8 else "")


def check_not_quantized(files: Files) -> None:
    scaled = [n for n in files.where if n.endswith(QUANT_SUFFIXES)]
    fp8 = [n for n, d in files.dtypes.items() if d.startswith("F8") and n.startswith("videodit_blocks.")]
    if scaled or fp8:
        example = (scaled or fp8)[0]
        raise QuantizedCheckpointError(
            f"{files.root}: {example} and {len(scaled) + len(fp8) - 1} more: " + FP8_QUANT_REFUSAL
        )


class VariantUnknownError(CheckpointError):
    """``variant`` auto, and neither the file's metadata nor its path says base or distill."""


def variant_in_path(path: str | os.PathLike) -> str | None:
    """``distill`` or ``base`` when one of the path's last three names says so, as Sand AI names them
    (``4.5B_distill/inference_weight.distill``, ``4.5B_base/inference_weight``); else None."""
    parts = [part.lower() for part in Path(path).resolve().parts[-3:]]
    if any("distill" in part for part in parts):
        return "distill"
    if any(re.search(r"(?<![a-z])base(?![a-z])", part) for part in parts):
        return "base"
    return None


def inspect_dit(path: str | os.PathLike, variant: str = "auto") -> DitCheckpoint:
    """Check a MAGI-1 DiT checkpoint from its headers: what it is, that it is complete, that this pack runs it.

    ``variant``: ``base`` / ``distill``, or ``auto``: the file's ``magi1_config`` metadata, else ``distill`` or
    ``base`` in a folder or file name of the path (:func:`variant_in_path`), else :class:`VariantUnknownError`
    (never a guess: the two variants run different pipelines). ``variant_from`` says which of these decided."""
    if variant not in ("auto", "base", "distill"):
        raise CheckpointError(f"variant {variant!r}: use auto, base or distill")
    files = locate(path)
    if PROBE_KEY not in files.where:
        if any(n.startswith("encoder.") or n.startswith("decoder.") for n in files.where):
            what = "a VAE (encoder./decoder. keys): load it with Load MAGI-1 VAE"
        else:
            what = f"keys under {_describe(files.where)}"
        raise NotMagiError(f"{path} is not a MAGI-1 DiT ({PROBE_KEY} is missing; it has {what})")
    check_not_quantized(files)
    meta = files.metadata.get(META_CONFIG)
    shapes = {k: v for k, v in files.shapes.items() if not k.startswith(SPECIAL_PREFIX)}
    try:
        if meta:
            config = MagiConfig.from_json(meta)
            said = "distill" in json.loads(meta)
        else:
            config, said = config_from_shapes(shapes), False
    except ConfigError as e:
        raise NotMagiError(f"{path}: {e}") from None
    if variant != "auto":
        config = MagiConfig(**{**config.__dict__, "distill": variant == "distill"})
        source = "variant input"
    elif said:
        source = "file metadata"
    else:
        named = variant_in_path(path)
        source = None if named is None else "path name"  # None: refused below, once the tensors are checked
        config = MagiConfig(**{**config.__dict__, "distill": named == "distill"})
    expected = expected_shapes(config)
    missing = sorted(set(expected) - set(shapes))
    if missing:
        raise CheckpointError(f"{path}: an incomplete MAGI-1 DiT: {len(missing)} tensors missing, e.g. {missing[:4]}")
    wrong = [f"{k} {shapes[k]} (expected {v})" for k, v in expected.items() if tuple(shapes[k]) != v]
    if wrong:
        raise CheckpointError(f"{path}: shapes that do not fit a MAGI-1 DiT of this size: {wrong[:3]}")
    unexpected = sorted(set(shapes) - set(expected))
    if unexpected:
        raise CheckpointError(
            f"{path}: {len(unexpected)} tensors no MAGI-1 DiT has, e.g. {unexpected[:4]} (a variant this pack "
            "does not know)"
        )
    if source is None:
        raise VariantUnknownError(
            f"{path}: nothing says whether this MAGI-1 is base or distill (no {META_CONFIG} metadata with "
            "'distill', no 'base' or 'distill' in its folder or file name), and the two run different "
            "pipelines (base: 3 passes per step, no step embedding). Set variant to base or distill"
        )
    special = sorted(k for k in files.where if k.startswith(SPECIAL_PREFIX))
    npz = None if special else npz_beside(path)
    if npz is not None:
        read_special_npz(npz)  # a damaged file is refused here, while loading, not in the middle of a run
    return DitCheckpoint(files, config, special, source, npz)


# ---------------------------------------------------------------------------------------------- the VAE
@dataclass
class VaeCheckpoint:
    files: Files
    config: object  # runtime.families.magi1.model.vae.VAEConfig

    def decoder_state_dict(self, device="cpu") -> dict[str, torch.Tensor]:
        names = [n for n in self.files.where if n.startswith("decoder.")]
        return {k[len("decoder.") :]: v for k, v in load_tensors(self.files, names, device).items()}


def inspect_vae(path: str | os.PathLike) -> VaeCheckpoint:
    """A MAGI-1 VAE: the folder (``config.json`` + ``diffusion_pytorch_model.safetensors``) or one file (its
    config in the ``magi1_vae_config`` metadata, else read from the decoder's shapes)."""
    from .vae import VAEConfig, VAEConfigError, config_from_decoder_shapes, decoder_shapes

    path = Path(path)
    files = locate(path, single_name=VAE_FILE)
    dec = {k[len("decoder.") :]: v for k, v in files.shapes.items() if k.startswith("decoder.")}
    if PROBE_KEY in files.where:
        raise NotMagiError(f"{path} is a MAGI-1 DiT, not its VAE: load it with Load MAGI-1 Model")
    if "proj_in.weight" not in dec or "pos_embed" not in dec:
        raise NotMagiError(
            f"{path} is not a MAGI-1 VAE (no decoder.proj_in / decoder.pos_embed; it has keys under {_describe(files.where)})"
        )
    try:
        cfg_file = path / VAE_CONFIG if path.is_dir() else None
        if cfg_file is not None and cfg_file.is_file():
            data = json.loads(cfg_file.read_text())
            if data.get("_class_name", "ViTVAE") != "ViTVAE" or data.get("model_type", "vit") != "vit":
                raise VAEConfigError(
                    f"{cfg_file}: {data.get('_class_name')} / {data.get('model_type')} is not the ViT VAE"
                )
            cfg = VAEConfig.from_ddconfig(data["ddconfig"])
        elif META_VAE_CONFIG in files.metadata:
            cfg = VAEConfig(**json.loads(files.metadata[META_VAE_CONFIG]))
        else:
            cfg = config_from_decoder_shapes(dec)
    except (VAEConfigError, KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"{path}: {e}") from None
    expected = decoder_shapes(cfg)
    missing = sorted(set(expected) - set(dec))
    wrong = [f"decoder.{k} {dec[k]} (expected {v})" for k, v in expected.items() if k in dec and tuple(dec[k]) != v]
    if missing or wrong:
        raise CheckpointError(f"{path}: not the decoder of this VAE config: missing {missing[:4]}, wrong {wrong[:3]}")
    return VaeCheckpoint(files, cfg)
