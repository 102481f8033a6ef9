"""Convert a Self-Forcing / CausVid training checkpoint (``.pt``) to a safetensors file UNETLoader loads as Wan 2.1 T2V.

    python tools/convert_checkpoint.py self_forcing_dmd.pt ComfyUI/models/diffusion_models/self_forcing_dmd.safetensors
    python tools/convert_checkpoint.py model.pt causvid.safetensors --key generator --dtype fp16
    python tools/convert_checkpoint.py self_forcing_dmd.pt self_forcing_causal.safetensors --causal
    python tools/convert_checkpoint.py models/tiny_ar/jensen-kv-tiny-ar.safetensors tiny-causal.safetensors --causal
    python tools/convert_checkpoint.py longlive_base.pt longlive.safetensors --lora lora.pt

Self-Forcing saves ``{"generator": ..., "generator_ema": ..., "critic": ...}`` and CausVid
``{"generator": ...}``: Wan 2.1 state dicts in fp32 whose keys carry the training wrappers'
prefixes (``model.blocks.0...``, ``model._fsdp_wrapped_module.blocks.0...``). ComfyUI's UNETLoader
lists ``.pt`` files but finds no model in that nesting. This tool:

1. checks the zip members first (``torch.save`` writes them uncompressed: a compressed member, a size the
   archive cannot hold or a pickle over :data:`MAX_PICKLE_BYTES` is refused before anything is unpickled),
   then loads the file with ``torch.load(..., map_location="cpu", weights_only=True)``: tensors and plain
   containers only, a pickle that holds anything else is refused, never executed (``mmap`` when the
   file allows it, so a 17 GB checkpoint is not read whole);
2. takes the sub-dict: ``--key``, else ``generator_ema`` (the EMA weights Self-Forcing samples with),
   else ``generator``, else the file itself when it is a bare state dict; with ``--lora``, ``generator`` (the
   weights LongLive's inference and LoRA training use), and a checkpoint without it is refused, not guessed;
3. strips the wrappers' path components: leading ``model.`` / ``module.`` / ``diffusion_model.``,
   and ``_fsdp_wrapped_module.`` / ``_checkpoint_wrapped_module.`` / ``_orig_mod.`` anywhere;
4. checks that every tensor's storage holds its data (a ``zeros(1).expand(30000, 30000)`` is 4 bytes in
   the file and 1.8 GB written out in bf16: refused) and that no storage is shared by more data than it holds;
5. checks that the result is a complete Wan 2.1 text-to-video model: every key of every block, each of
   the shape a Wan of its ``dim`` (``head.modulation`` is ``(1, 2, dim)``) and ``ffn_dim`` has, no
   dimension beyond the largest Wan 2.1 T2V (14B: dim 5120, ffn 13824, 40 blocks), 16 latent channels,
   no image-embedding ``img_emb.`` (or VACE, control, reference) keys, keys no Wan has at most
   :data:`EXTRA_FRACTION` of the model; and that the output is at most :data:`OUTPUT_FACTOR` x the
   input file (+1 MiB); only then makes every tensor contiguous and casts floating tensors to
   ``--dtype`` (default bf16);
6. where ComfyUI is importable (``--comfyui PATH``, ``COMFYUI_PATH``, already on ``sys.path``, or a
   folder above this pack), runs ComfyUI's own ``model_detection.model_config_from_unet`` on it and
   requires WAN21 T2V;
7. only then writes OUT atomically (a temporary file in OUT's folder, renamed at the end): a failed
   run leaves no half-written file.

Every refusal is a :class:`ConversionError` naming what is wrong; ``main`` prints it and exits with 2.

``--causal`` adds the safetensors metadata ``config`` = ``{"transformer": {"causal_ar": true}}`` (JSON,
merged into any ``config`` already there). ComfyUI v0.27 and later read it in ``model_detection`` and
load the file as ``WAN21_CausalAR`` (``CausalWanModel``, the model of core's own AR video sampler,
``SamplerARVideo``; default sampling shift 5 instead of Wan's 8); ComfyUI versions without that path
(v0.3.64) ignore it and load plain ``WAN21``. The weights are the same either way, and the pack's
Chunked AR sampler runs both.

``--lora LORA.pt [--lora-alpha A]`` merges a PEFT LoRA (LongLive 1.0: ``longlive_base.pt``'s ``generator`` plus
``lora.pt``, rank 256, alpha 256) into the weights: the LoRA file is loaded and checked as the input is (steps 1
and 4), read by :func:`read_lora` and merged by :func:`merge_lora` after step 5, ``W + (alpha / r) · B · A`` in
fp32, then cast. Modules that match no weight, an A without its B, shapes that do not fit and a non-finite or
non-positive alpha are refused with their names; the output's metadata records the LoRA (file name, SHA-256,
rank, alpha).

A ``.safetensors`` INPUT (a file already in ComfyUI's layout, e.g. the pack's tiny model) is copied
instead of converted: its tensor bytes unchanged, its metadata kept, ``config`` merged as above
(``--causal`` is required then, ``--key`` and ``--dtype`` do not apply; the input file is never
modified). The same key check and ComfyUI detection run on it first. A single-file checkpoint whose keys
carry training-wrapper prefixes - Krea Realtime 14B's ``krea-realtime-video-14b.safetensors``, which scope
loads after dropping a ``model.`` in front of every key (``wan2_1/components/generator.py``) - has them
stripped the same way (:func:`check_prefixes` names them first): only the header's key names are rewritten,
the tensor bytes are copied unchanged, and ``--causal`` is optional. A prefix that is no known wrapper is
refused with a listing of every prefix found.

``--magi1 FOLDER_OR_FILE`` turns Sand AI's MAGI-1 DiT (``ckpt/magi/<model>/inference_weight[.distill]/``: a
``model.safetensors.index.json`` and its shards, or one ``model.safetensors``) into one file for
``models/diffusion_models`` (Load MAGI-1 Model), and ``--magi1-vae FOLDER`` the VAE folder (``ckpt/vae``:
``config.json`` + ``diffusion_pytorch_model.safetensors``) into one file for ``models/vae`` (Load MAGI-1 VAE).
Both go through :mod:`runtime.families.magi1.model.checkpoint` first (headers only: the index's shard names must be plain files of
the folder, every tensor the index names must be in its shard, no tensor twice, a complete model of exact
shapes; ``.zst`` shards and the ``distill_quant`` fp8 weights are refused with the way on), then copy every
tensor's bytes unchanged into one file (streamed, never loaded whole), with the architecture in the metadata
(``magi1_config`` / ``magi1_vae_config``), written atomically and at most the inputs' size plus 1 MiB.
``--special-tokens special_tokens.npz`` (``example/assets/`` of the MAGI-1 repository) adds the caption's
special tokens as ``special_tokens.<NAME>`` (float16, as the reference uses them); ``--variant`` and
``--config`` (the reference's ``example/*/*_config.json``) say base or distill and the input scale.

``convert()`` and the checks are the pure part (no ComfyUI needed), in
``runtime/families/wan/model/checkpoint.py``: Load AR Video Checkpoint runs the same code at load time, so the
published files load without this step. ``main(argv)`` is the command line.
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import json
import os
import shutil
import struct
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))  # tools/ is no package: the pack's pure-torch modules import on their own

# the checks and the conversion, shared with Load AR Video Checkpoint (nodes/wan.py); re-exported for callers of
# this tool's functions
from runtime.families.wan.model import checkpoint as wan_checkpoint  # noqa: E402, F401
from runtime.families.wan.model.checkpoint import *  # noqa: E402, F403
from runtime.families.wan.model.checkpoint import (  # noqa: E402
    _ST_DTYPES,
    DTYPES,
    OUTPUT_FACTOR,
    OUTPUT_SLACK,
    SAFETENSORS_SUFFIXES,
    ConversionError,
    check_extents,
    check_lora_alpha,
    check_prefixes,
    check_recorded_dtype,
    check_wan_t2v,
    conversion_metadata,
    convert,
    load_checkpoint,
    lora_metadata,
    meta_state_dict,
    read_lora,
    read_safetensors_header,
    select_state_dict,
    strip_key,
    strip_wrappers,
    stripped_metadata,
    with_causal_config,
)


def _write_atomic(out: Path, write) -> None:
    """``write(tmp_path)`` to a temporary file next to ``out``, fsynced and renamed onto it once complete."""
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def copy_safetensors_with_metadata(
    src: Path, out: Path, metadata: dict[str, str], rename: dict[str, str] | None = None
) -> None:
    """``src`` to ``out`` (atomically) with ``metadata`` as its ``__metadata__``; tensor bytes copied unchanged.

    Only the JSON header is rewritten (padded with spaces to 8 bytes, as the safetensors library
    does); the data offsets are relative to the end of the header, so they stay valid. ``rename``
    maps old tensor names to new ones (the rest keep theirs).
    """
    header, data_start = read_safetensors_header(src)
    rename = rename or {}
    header = {
        "__metadata__": {str(k): str(v) for k, v in metadata.items()},
        **{rename.get(k, k): v for k, v in header.items() if k != "__metadata__"},
    }
    blob = json.dumps(header, separators=(",", ":")).encode("utf-8")
    blob += b" " * (-len(blob) % 8)

    def write(tmp):
        with open(src, "rb") as fin, open(tmp, "wb") as fout:
            fout.write(struct.pack("<Q", len(blob)))
            fout.write(blob)
            fin.seek(data_start)
            shutil.copyfileobj(fin, fout, 16 * 2**20)

    _write_atomic(out, write)


# ----------------------------------------------------------------------------- ComfyUI's own detection
def _is_comfyui(p: Path) -> bool:
    return (p / "comfy" / "model_detection.py").is_file() and (p / "main.py").is_file()


def find_comfyui(explicit: str | None = None) -> Path | None:
    """--comfyui, COMFYUI_PATH, a ComfyUI already importable, or a folder above this pack (custom_nodes layout)."""
    for c in (explicit, os.environ.get("COMFYUI_PATH")):
        if c and _is_comfyui(Path(c)):
            return Path(c).resolve()
    if explicit:
        raise ConversionError(f"--comfyui {explicit}: no ComfyUI checkout there (comfy/model_detection.py, main.py)")
    spec = importlib.util.find_spec("comfy")
    if spec is not None and spec.submodule_search_locations:
        root = Path(list(spec.submodule_search_locations)[0]).parent
        if _is_comfyui(root):
            return root
    for parent in Path(__file__).resolve().parents:
        if _is_comfyui(parent):
            return parent
    return None


def comfyui_detect(sd: dict[str, torch.Tensor], comfy_dir: Path, metadata: dict[str, str] | None = None) -> str:
    """Run ComfyUI's ``model_config_from_unet`` on ``sd`` (with the file's ``metadata``, as UNETLoader reads it
    where ComfyUI takes metadata); the model class it finds, or ConversionError."""
    if str(comfy_dir) not in sys.path:
        sys.path.insert(0, str(comfy_dir))
    if "comfy.model_management" not in sys.modules:
        import comfy.cli_args

        if not torch.cuda.is_available():
            comfy.cli_args.args.cpu = True  # model_management refuses to import on a CPU-only torch otherwise
    import comfy.model_detection

    meta = {}
    if (
        metadata is not None
        and "metadata" in inspect.signature(comfy.model_detection.model_config_from_unet).parameters
    ):
        meta = {"metadata": metadata}
    try:
        unet = comfy.model_detection.detect_unet_config(sd, "", **meta) or {}
        config = comfy.model_detection.model_config_from_unet(dict(sd), "", **meta)
    except Exception as e:  # noqa: BLE001 - ComfyUI's detection indexes keys it assumes present
        raise ConversionError(
            f"ComfyUI's model detection failed on the converted weights ({type(e).__name__}: "
            f"{str(e)[:200]}); they would not load as Wan 2.1 T2V"
        ) from None
    what = f"image_model {unet.get('image_model')!r}, model_type {unet.get('model_type')!r}"
    if config is None:
        raise ConversionError(
            f"ComfyUI's model detection recognises no model in the converted weights ({what}); "
            "it would not load as Wan 2.1 T2V"
        )
    unet = getattr(config, "unet_config", unet)
    found = f"{type(config).__name__} (image_model {unet.get('image_model')!r}, model_type {unet.get('model_type')!r})"
    if unet.get("image_model") != "wan2.1" or unet.get("model_type") != "t2v":
        raise ConversionError(f"ComfyUI detects the converted weights as {found}, not Wan 2.1 T2V")
    return found


# ----------------------------------------------------------------------------- writing
def save_atomic(sd: dict[str, torch.Tensor], out: Path, metadata: dict[str, str]) -> None:
    """safetensors to a temporary file next to ``out``, renamed onto it once complete."""
    from safetensors.torch import save_file

    _write_atomic(out, lambda tmp: save_file(sd, tmp, metadata=metadata))


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="convert_checkpoint.py",
        description="Convert a Self-Forcing / CausVid .pt checkpoint to a Wan 2.1 T2V safetensors file for UNETLoader "
        "(--causal: flagged for ComfyUI's causal AR model class; a .safetensors input is copied with the "
        "flag added).",
    )
    p.add_argument(
        "input",
        help="the .pt checkpoint (loaded with weights_only=True), or a .safetensors Wan 2.1 T2V "
        "file to copy with --causal (left unchanged)",
    )
    p.add_argument("output", help="the .safetensors file to write (e.g. ComfyUI/models/diffusion_models/x.safetensors)")
    p.add_argument(
        "--key",
        help="the entry holding the weights (default: generator_ema, then generator, then the "
        "file itself when it is a bare state dict; with --lora: generator, as LongLive merges its LoRA into it); "
        ".pt input only",
    )
    p.add_argument(
        "--dtype",
        choices=sorted(DTYPES),
        default=None,
        help="dtype of the written weights (default bf16); .pt input only (a .safetensors input keeps its "
        "tensors as they are)",
    )
    p.add_argument(
        "--causal",
        action="store_true",
        help='write the metadata config = {"transformer": {"causal_ar": true}} (merged into an existing '
        "config): ComfyUI v0.27+ then loads the file as WAN21_CausalAR (CausalWanModel, for its "
        "SamplerARVideo; default shift 5), older ComfyUI as plain WAN21. The pack's Chunked AR "
        "sampler runs either. Required for a .safetensors input",
    )
    p.add_argument(
        "--comfyui",
        metavar="PATH",
        help="a ComfyUI checkout whose model detection checks the result "
        "(default: COMFYUI_PATH, an importable ComfyUI, or a folder above "
        "this pack; without one only the key check runs)",
    )
    p.add_argument(
        "--lora",
        metavar="LORA.pt",
        help="a PEFT LoRA to merge into the weights (LongLive's lora.pt: its 'generator_lora' entry or the bare "
        "state dict of base_model.model.<module>.lora_A.weight / .lora_B.weight), read with the same checks as "
        "the input; W + (alpha / r) B A in fp32, then cast to --dtype; .pt input only",
    )
    p.add_argument(
        "--lora-alpha",
        type=float,
        metavar="A",
        help="the LoRA's alpha (default: r, read from lora_A's rows, as LongLive's config has it: rank 256, alpha 256)",
    )
    p.add_argument(
        "--magi1",
        action="store_true",
        help="INPUT is Sand AI's MAGI-1 DiT (a folder with model.safetensors.index.json and shards, or one "
        "model.safetensors): write it as one file for Load MAGI-1 Model (tensor bytes unchanged)",
    )
    p.add_argument(
        "--magi1-vae",
        action="store_true",
        help="INPUT is MAGI-1's VAE folder (config.json + diffusion_pytorch_model.safetensors): write one file for "
        "Load MAGI-1 VAE",
    )
    p.add_argument(
        "--variant",
        choices=("auto", "base", "distill"),
        default="auto",
        help="--magi1: base or distill (auto: the file's metadata, --config, or 'distill' / 'base' in the folder's "
        "name, as Sand AI names them; refused when none says)",
    )
    p.add_argument(
        "--special-tokens",
        metavar="NPZ",
        help="--magi1: MAGI-1's example/assets/special_tokens.npz, stored in the file as special_tokens.<NAME> "
        "(the HQ / DURATION caption tokens the sampler puts in front of the prompt)",
    )
    p.add_argument(
        "--config",
        metavar="JSON",
        help="--magi1: the reference's example/*/*_config.json (its model_config and engine_config.distill "
        "are checked against the weights and stored)",
    )
    p.add_argument("--overwrite", action="store_true", help="replace OUTPUT if it exists")
    return p


def _detection(sd, args, metadata) -> str:
    comfy_dir = find_comfyui(args.comfyui)
    if comfy_dir is None:
        return "skipped (no ComfyUI found: pass --comfyui PATH or set COMFYUI_PATH); the key check passed"
    found = comfyui_detect(sd, comfy_dir, metadata)
    if args.causal and not found.startswith("WAN21_CausalAR"):
        found += (
            "; this ComfyUI has no causal AR model class for the flag (ComfyUI v0.27+ loads the file as WAN21_CausalAR)"
        )
    return f"{found} [{comfy_dir}]"


def _copy_safetensors(args, src: Path, out: Path) -> int:
    if args.key is not None or args.dtype is not None or args.lora is not None or args.lora_alpha is not None:
        raise ConversionError(
            "--key and --dtype apply to .pt checkpoints, as do --lora and --lora-alpha; a .safetensors input is "
            "copied as it is"
        )
    header, data_start = read_safetensors_header(src)
    names = [k for k in header if k != "__metadata__"]
    prefixes = [p for p in check_prefixes(names) if p]
    if not args.causal and not prefixes:
        raise ConversionError(
            f"{src} is already a safetensors file in ComfyUI's layout: pass --causal to copy it with the causal AR "
            "flag (there is nothing to convert otherwise)"
        )
    try:
        sd = strip_wrappers(meta_state_dict(header))
    except ConversionError as e:
        raise ConversionError(f"{e} (prefixes found: {', '.join(prefixes)})") from None
    check_extents(header, data_start, src.stat().st_size)
    check_recorded_dtype(header)
    info = check_wan_t2v(sd)
    metadata = dict(header.get("__metadata__") or {})
    if prefixes:
        metadata.update(stripped_metadata(src.name, prefixes))
    if args.causal:
        metadata = with_causal_config(metadata)
    detection = _detection(sd, args, metadata)
    copy_safetensors_with_metadata(src, out, metadata, {k: strip_key(k) for k in names})
    flag = f", metadata config {metadata['config']}" if args.causal else ""
    stripped = f", key prefixes {', '.join(repr(p) for p in prefixes)} stripped" if prefixes else ""
    print(f"wrote {out}: {len(sd)} tensors copied unchanged from {src.name}{stripped}{flag}")
    print(f"model: {info}")
    print(f"ComfyUI detection: {detection}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    src, out = Path(args.input), Path(args.output)
    try:
        if out.suffix.lower() not in SAFETENSORS_SUFFIXES:
            raise ConversionError(f"{out}: the output must be a .safetensors file")
        if out.exists() and out.resolve() == src.resolve():
            raise ConversionError("the output would replace the input")
        if out.exists() and not args.overwrite:
            raise ConversionError(f"{out} exists; pass --overwrite to replace it")
        if args.magi1 or args.magi1_vae:
            return convert_magi1(args, src, out)
        if args.variant != "auto" or args.special_tokens or args.config:
            raise ConversionError("--variant, --special-tokens and --config apply to --magi1")
        if src.suffix.lower() in SAFETENSORS_SUFFIXES:
            return _copy_safetensors(args, src, out)
        dtype = args.dtype or "bf16"
        check_lora_alpha(args.lora_alpha)
        if args.lora_alpha is not None and args.lora is None:
            raise ConversionError("--lora-alpha applies to a --lora; there is none")
        lora = read_lora(load_checkpoint(args.lora)) if args.lora is not None else None
        state = load_checkpoint(src)
        used, _ = select_state_dict(state, args.key, lora=lora is not None)
        sd = convert(
            state,
            key=used,
            dtype=dtype,
            max_output_bytes=OUTPUT_FACTOR * src.stat().st_size + OUTPUT_SLACK,
            lora=lora,
            lora_alpha=args.lora_alpha,
        )
        info = check_wan_t2v(sd)
        del state
        metadata = conversion_metadata(src.name, used, dtype)
        if lora is not None:
            metadata.update(lora_metadata(Path(args.lora), lora, args.lora_alpha))
        if args.causal:
            metadata = with_causal_config(metadata)
        detection = _detection(sd, args, metadata)
        save_atomic(sd, out, metadata)
    except ConversionError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    size = sum(v.numel() * v.element_size() for v in sd.values())
    shown = f"{size / 2**30:.2f} GiB" if size >= 2**30 else f"{size / 2**20:.1f} MiB"
    print(
        f"wrote {out}: {len(sd)} tensors, {shown} {dtype}, from "
        f"{repr(used) if used else 'a bare state dict'} of {src.name}"
        f"{', flagged causal_ar (metadata config)' if args.causal else ''}"
    )
    if lora is not None:
        print(
            f"merged LoRA {metadata['lora_file']} ({metadata['lora_modules']} modules, rank {metadata['lora_rank']}, "
            f"alpha {metadata['lora_alpha']}) in fp32 before the cast"
        )
    print(f"model: {info}")
    print(f"ComfyUI detection: {detection}")
    return 0


# ----------------------------------------------------------------------------- MAGI-1 (Sand AI's folders)
def _magi1_modules():
    """MAGI-1's pure-torch model, ``runtime/families/magi1/model/`` (the pack root appended to ``sys.path``: tools/
    is no package; the model imports on its own)."""
    root = str(Path(__file__).resolve().parents[1])
    if root not in sys.path:
        sys.path.append(root)
    import runtime.families.magi1.model.caption
    import runtime.families.magi1.model.checkpoint
    import runtime.families.magi1.model.config
    import runtime.families.magi1.model.vae

    return runtime.families.magi1.model


def _special_token_tensors(path: Path) -> dict[str, torch.Tensor]:
    """The npz's caption tokens as the loader reads them beside a checkpoint (the same function), stored float16."""
    m = _magi1_modules()
    try:
        tokens = m.checkpoint.read_special_npz(path)
    except m.checkpoint.CheckpointError as e:
        raise ConversionError(f"--special-tokens {e}") from None
    return {m.caption.PREFIX + k: v.half() for k, v in tokens.items()}


def merge_safetensors(
    sources: dict[str, tuple[Path, dict, int]], extra: dict[str, torch.Tensor], out: Path, metadata: dict[str, str]
) -> None:
    """One safetensors file of ``sources`` (name -> (file, its header entry, its data start)), their bytes copied
    unchanged and streamed, plus the ``extra`` tensors, written atomically."""
    names = sorted({*sources, *extra})
    header: dict = {"__metadata__": {str(k): str(v) for k, v in metadata.items()}}
    blobs: dict[str, bytes] = {}
    offset = 0
    inv = {v: k for k, v in _ST_DTYPES.items()}
    for n in names:
        if n in extra:
            t = extra[n].detach().cpu().contiguous()
            blobs[n] = t.reshape(-1).view(torch.uint8).numpy().tobytes()
            size, dtype, shape = len(blobs[n]), inv[t.dtype], list(t.shape)
        else:
            _, info, _ = sources[n]
            a, b = info["data_offsets"]
            size, dtype, shape = b - a, info["dtype"], info["shape"]
        header[n] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    blob = json.dumps(header, separators=(",", ":")).encode("utf-8")
    blob += b" " * (-len(blob) % 8)

    def write(tmp):
        handles: dict[Path, object] = {}
        try:
            with open(tmp, "wb") as fout:
                fout.write(struct.pack("<Q", len(blob)))
                fout.write(blob)
                for n in names:
                    if n in blobs:
                        fout.write(blobs[n])
                        continue
                    path, info, start = sources[n]
                    f = handles.get(path) or handles.setdefault(path, open(path, "rb"))
                    a, b = info["data_offsets"]
                    f.seek(start + a)
                    left = b - a
                    while left:
                        chunk = f.read(min(left, 16 << 20))
                        if not chunk:
                            raise ConversionError(f"{path} ended inside {n}")
                        fout.write(chunk)
                        left -= len(chunk)
        finally:
            for f in handles.values():
                f.close()

    _write_atomic(out, write)


def convert_magi1(args, src: Path, out: Path) -> int:
    """--magi1 / --magi1-vae: Sand AI's folder (or file) -> one checked safetensors file, bytes unchanged."""
    if args.magi1 and args.magi1_vae:
        raise ConversionError("--magi1 and --magi1-vae: pick one (the DiT or the VAE)")
    for flag in ("key", "dtype", "lora", "lora_alpha"):
        if getattr(args, flag) is not None:
            raise ConversionError(
                f"--{flag.replace('_', '-')} does not apply to MAGI-1 (its tensors are copied as they are)"
            )
    if args.causal:
        raise ConversionError("--causal is for Wan files; MAGI-1 has its own loader (Load MAGI-1 Model)")
    m = _magi1_modules()
    ck = m.checkpoint
    try:
        if args.magi1:
            try:
                info = ck.inspect_dit(src, args.variant)
            except ck.VariantUnknownError as e:
                if not args.config:
                    raise ConversionError(f"{e} (--variant base or --variant distill)") from None
                info = ck.inspect_dit(src, "base")  # --config says which (below)
            config = info.config
            if args.config:
                try:
                    ref = m.config.MagiConfig.from_reference_json(json.loads(Path(args.config).read_text()))
                except (OSError, ValueError) as e:
                    raise ConversionError(f"--config {args.config}: {e}") from None
                if args.variant != "auto" and ref.distill != config.distill:
                    raise ConversionError(f"--config says distill={ref.distill}, --variant says {args.variant}")
                if m.config.expected_shapes(ref) != m.config.expected_shapes(config):
                    raise ConversionError(f"--config {args.config} describes another architecture than the weights")
                config = ref
            files, names = info.files, sorted(m.config.expected_shapes(config))
            metadata = {ck.META_CONFIG: config.to_json()}
            extra = _special_token_tensors(Path(args.special_tokens)) if args.special_tokens else {}
            kept = [k for k in info.special_tokens if k not in extra]
            names += kept
            what = f"MAGI-1 DiT ({config.num_layers} layers, hidden {config.hidden_size}, {config.num_attention_heads} query / {config.num_query_groups} K/V heads, {'distill' if config.distill else 'base'})"
        else:
            if args.variant != "auto" or args.special_tokens or args.config:
                raise ConversionError("--variant, --special-tokens and --config apply to --magi1")
            info = ck.inspect_vae(src)
            files, names = info.files, sorted(info.files.where)
            metadata = {ck.META_VAE_CONFIG: json.dumps(info.config.to_dict(), sort_keys=True)}
            extra = {}
            what = f"MAGI-1 VAE ({info.config.depth} decoder blocks, embed {info.config.embed_dim})"
    except ck.CheckpointError as e:
        raise ConversionError(str(e)) from None
    headers = {p: ck.read_header(p) for p in files.files}
    sources = {n: (files.where[n], headers[files.where[n]][0][n], headers[files.where[n]][1]) for n in names}
    size = sum(b - a for _, inf, _ in sources.values() for a, b in [inf["data_offsets"]])
    if size > files.nbytes() + OUTPUT_SLACK:
        raise ConversionError(f"the output would be {size} bytes, more than the inputs' {files.nbytes()}")
    metadata.update(
        {"format": "pt", "converted_from": src.name, "converted_by": "comfyui-jensen-kv tools/convert_checkpoint.py"}
    )
    merge_safetensors(sources, extra, out, metadata)
    shown = f"{size / 2**30:.2f} GiB" if size >= 2**30 else f"{size / 2**20:.1f} MiB"
    print(
        f"wrote {out}: {len(sources) + len(extra)} tensors, {shown}, bytes unchanged from {len(files.files)} file(s) of {src}"
    )
    print(f"model: {what}" + (f"; {len(extra)} special tokens from {args.special_tokens}" if extra else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
