"""MAGI-1's caption glue: special tokens in front of the T5 caption, per chunk, and the null caption.

The reference (``inference/pipeline/prompt_process.py`` and ``_process_txt_embeddings`` /
``_process_null_embeddings`` of ``video_generate.py``) encodes the prompt once with T5-XXL (``t5-v1_1-xxl``,
at most 800 tokens, float32), then, per chunk, puts learned 4096-wide embeddings in front of the caption's
tokens, each one prepended in turn (so the last one of the list ends up first) and cut to 800 tokens:

- ``HQ_TOKEN`` when ``PAD_HQ`` is set and ``DURATION_TOKEN_k`` when ``PAD_DURATION`` is set (its
  ``example/*/run.sh`` and its ComfyUI nodes set both): ``k`` = chunks left after this one + 1, at most 8;
  so a chunk's caption is ``[DURATION_k, HQ, T5 tokens ...]``;
- the null caption (negative prompt and the clean chunk's caption) is the first 50 rows of the model's
  ``null_caption_embedding`` (with ``NEG_PROMPT`` set, CAPTION / LOGO / TRANS / BORDERNESS tokens go in front).

The embeddings are ``example/assets/special_tokens.npz`` of the reference repository (``caption_token``,
``logo_token`` and 100 ``other_tokens``, stored float64, used rounded to float16);
:data:`SPECIAL_TOKEN_ROWS` says which row is which. ``tools/convert_checkpoint.py`` copies them into a
converted DiT file (keys ``special_tokens.<NAME>``).

Only valid tokens are kept (the reference packs its masked captions before cross-attention), so a caption
here is a (tokens, 4096) tensor.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

MAX_TOKENS = 800
NULL_TOKENS = 50
#: name -> (array in special_tokens.npz, row)
SPECIAL_TOKEN_ROWS: dict[str, tuple[str, int]] = {
    "CAPTION_TOKEN": ("caption_token", 0),
    "LOGO_TOKEN": ("logo_token", 0),
    "TRANS_TOKEN": ("other_tokens", 0),
    "HQ_TOKEN": ("other_tokens", 1),
    "STATIC_FIRST_FRAMES_TOKEN": ("other_tokens", 2),
    "DYNAMIC_FIRST_FRAMES_TOKEN": ("other_tokens", 3),
    "BORDERNESS_TOKEN": ("other_tokens", 4),
    **{f"DURATION_TOKEN_{i + 1}": ("other_tokens", 7 + i) for i in range(8)},
    "THREE_D_MODEL_TOKEN": ("other_tokens", 15),
    "TWO_D_ANIME_TOKEN": ("other_tokens", 16),
}
#: the order the reference prepends them in (``get_special_token_keys``), ``DURATION_TOKEN`` always last
PAD_ORDER = (
    "STATIC_FIRST_FRAMES_TOKEN",
    "DYNAMIC_FIRST_FRAMES_TOKEN",
    "BORDERNESS_TOKEN",
    "HQ_TOKEN",
    "THREE_D_MODEL_TOKEN",
    "TWO_D_ANIME_TOKEN",
    "DURATION_TOKEN",
)
#: what ``run.sh`` and Sand AI's ComfyUI nodes set (PAD_HQ=1, PAD_DURATION=1)
DEFAULT_TOKENS = ("HQ_TOKEN", "DURATION_TOKEN")
NEGATIVE_TOKENS = ("CAPTION_TOKEN", "LOGO_TOKEN", "TRANS_TOKEN", "BORDERNESS_TOKEN")
PREFIX = "special_tokens."


def special_tokens_from_arrays(arrays: Mapping[str, object]) -> dict[str, Tensor]:
    """The named tokens (float32 values of the float16-rounded rows) from ``special_tokens.npz``'s arrays."""
    out = {}
    for name, (array, row) in SPECIAL_TOKEN_ROWS.items():
        if array not in arrays:
            raise ValueError(f"special tokens: the array {array!r} is missing (have {sorted(arrays)})")
        t = torch.as_tensor(arrays[array])
        if t.ndim != 2 or t.shape[0] <= row:
            raise ValueError(f"special tokens: {array} has shape {tuple(t.shape)}; row {row} ({name}) is missing")
        out[name] = t[row].to(torch.float16).float()
    return out


def _token(special: Mapping[str, Tensor] | None, name: str) -> Tensor:
    if not special or name not in special:
        raise ValueError(
            f"MAGI-1 caption: the special token {name} is not available. Put Sand AI's special_tokens.npz "
            "(example/assets/ of github SandAI-org/MAGI-1) beside the checkpoint in models/diffusion_models and "
            "load the model again, or convert the DiT with tools/convert_checkpoint.py --special-tokens "
            "special_tokens.npz so the file carries them, or turn the special tokens off"
        )
    return special[name].float().reshape(-1)


def chunk_captions(
    caption: Tensor,
    chunks: int,
    special: Mapping[str, Tensor] | None,
    tokens: Sequence[str] = DEFAULT_TOKENS,
    max_tokens: int = MAX_TOKENS,
) -> list[Tensor]:
    """One caption per chunk: ``caption`` (tokens, width), its valid T5 tokens, with ``tokens`` in front as the
    reference pads them (each prepended in :data:`PAD_ORDER` order, cut to ``max_tokens``)."""
    if caption.ndim != 2:
        raise ValueError(f"caption has shape {tuple(caption.shape)}; expected (tokens, width)")
    unknown = [t for t in tokens if t not in PAD_ORDER]
    if unknown:
        raise ValueError(f"unknown special tokens {unknown}; known: {list(PAD_ORDER)}")
    order = [t for t in PAD_ORDER if t in tokens]
    cap = caption.float()
    out = []
    for i in range(chunks):
        seq = cap
        for name in order:
            if name == "DURATION_TOKEN":
                name = f"DURATION_TOKEN_{min(chunks - i - 1, 7) + 1}"
            tok = _token(special, name).to(seq.device)
            seq = torch.cat([tok[None], seq], dim=0)[:max_tokens]
        out.append(seq)
    return out


def null_caption(null_embedding: Tensor, special: Mapping[str, Tensor] | None = None, negative: bool = False) -> Tensor:
    """The reference's null caption: the first 50 rows of ``null_caption_embedding`` (with ``negative``: the
    NEG_PROMPT tokens prepended first, as ``_process_null_embeddings`` does)."""
    seq = null_embedding.float()
    if negative:
        for name in NEGATIVE_TOKENS:
            seq = torch.cat([_token(special, name).to(seq.device)[None], seq], dim=0)[:MAX_TOKENS]
    return seq[:NULL_TOKENS]


# ---------------------------------------------------------------------------------------------- text
def clean_text(text: str) -> str:
    """The part of the reference's T5 prompt cleaning (``T5Embedder.clean_caption``) every prompt meets: lower
    case (the T5 tokenizer is case-sensitive), whitespace collapsed, ends stripped. Its other rules (ftfy
    repair, URL / HTML / CJK / file-name removal, punctuation and dash rewriting) are not reproduced: a prompt
    of plain words and ordinary punctuation may still differ where the reference rewrites punctuation."""
    return re.sub(r"\s+", " ", str(text)).strip().lower()
