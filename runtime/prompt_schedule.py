"""Prompt schedules: which positive CONDITIONING each chunk of a Chunked AR video is made with.

A schedule travels as an ordinary CONDITIONING (so it plugs into every ``positive`` input the
samplers have): one entry per prompt, each entry's dict carrying the chunk it starts at under
:data:`START_KEY`. The **Prompt Schedule** node builds it; a plain one-entry CONDITIONING is a
schedule with one prompt starting at chunk 0. Chunk indices count the whole video: a prefix clip's
chunks and the chunks of a run this one continues come first.

No ComfyUI import here.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch

START_KEY = "jensen_kv_start_chunk"
LABEL_KEY = "jensen_kv_label"


def cond_fingerprint(entry) -> str:
    """A short hash of one CONDITIONING entry's tensor (what the model sees), to tell prompts apart."""
    t = entry[0]
    h = hashlib.sha256()
    h.update(str((tuple(t.shape), str(t.dtype))).encode())
    h.update(t.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


@dataclass(frozen=True)
class ScheduledPrompt:
    start_chunk: int
    entry: list  # [tensor, dict] without the schedule keys
    label: str
    fingerprint: str


class PromptSchedule:
    """Prompts by chunk; :meth:`at` gives the one-entry CONDITIONING for a chunk."""

    def __init__(self, prompts: list[ScheduledPrompt]):
        if not prompts:
            raise ValueError("a prompt schedule needs at least one prompt")
        starts = [p.start_chunk for p in prompts]
        if starts != sorted(starts) or len(set(starts)) != len(starts):
            raise ValueError(f"prompt schedule start chunks {starts} must be distinct and increasing")
        self.prompts = prompts

    @classmethod
    def from_conditioning(cls, positive, what: str = "positive") -> PromptSchedule:
        """Parse a CONDITIONING: one plain entry, or entries that all carry a start chunk."""
        if not isinstance(positive, list) or not positive:
            raise ValueError(f"{what} must be a CONDITIONING with at least one entry")
        starts = [e[1].get(START_KEY) if isinstance(e, (list, tuple)) and len(e) == 2 else None for e in positive]
        if len(positive) == 1 and starts[0] is None:
            starts = [0]
        if any(s is None for s in starts):
            raise ValueError(
                f"{what} conditioning has {len(positive)} entries; the Chunked AR sampler keeps one KV cache per CFG "
                "branch and needs exactly one prompt per chunk: merge them with ConditioningConcat or "
                "ConditioningAverage, or build a schedule with the Prompt Schedule node"
            )
        if 0 not in starts:
            raise ValueError(
                f"the prompt schedule starts at chunk {min(starts)}; its first prompt must start at chunk 0"
            )
        prompts = []
        for i, (entry, start) in enumerate(sorted(zip(positive, starts), key=lambda p: p[1])):
            extra = {k: v for k, v in entry[1].items() if k not in (START_KEY, LABEL_KEY)}
            label = str(entry[1].get(LABEL_KEY) or f"prompt {i + 1}")
            prompts.append(ScheduledPrompt(int(start), [entry[0], extra], label, cond_fingerprint(entry)))
        return cls(prompts)

    def __len__(self) -> int:
        return len(self.prompts)

    def index_at(self, chunk: int) -> int:
        """Index (into ``prompts``) of the prompt chunk ``chunk`` is made with."""
        idx = 0
        for i, p in enumerate(self.prompts):
            if p.start_chunk <= chunk:
                idx = i
        return idx

    def at(self, chunk: int) -> list:
        """The one-entry CONDITIONING for chunk ``chunk``."""
        return [list(self.prompts[self.index_at(chunk)].entry)]

    def fingerprint_at(self, chunk: int) -> str:
        return self.prompts[self.index_at(chunk)].fingerprint

    def describe(self) -> list[dict]:
        return [{"start_chunk": p.start_chunk, "label": p.label, "fingerprint": p.fingerprint} for p in self.prompts]


def add_to_schedule(schedule, conditioning, start_chunk: int, label: str = "") -> list:
    """A schedule CONDITIONING with ``conditioning`` (one entry) starting at ``start_chunk`` added.

    ``schedule`` is None (start a new schedule: the first prompt must start at chunk 0) or the
    output of an earlier call. A chunk that already has a prompt gets the new one instead.
    """
    if not isinstance(conditioning, list) or len(conditioning) != 1:
        n = len(conditioning) if isinstance(conditioning, list) else type(conditioning).__name__
        raise ValueError(
            f"conditioning has {n} entries; a scheduled prompt is one entry (merge with ConditioningConcat)"
        )
    if isinstance(start_chunk, bool) or not isinstance(start_chunk, int) or start_chunk < 0:
        raise ValueError(f"start_chunk={start_chunk!r} must be a chunk index >= 0")
    entries = []
    if schedule is not None:
        PromptSchedule.from_conditioning(schedule, "schedule")  # validates it
        entries = [e for e in schedule if e[1].get(START_KEY, 0) != start_chunk]
    elif start_chunk != 0:
        raise ValueError(
            f"the first prompt of a schedule must start at chunk 0, not {start_chunk}: "
            "set start_chunk 0 on the first Prompt Schedule node of the chain"
        )
    tensor, extra = conditioning[0]
    new = [tensor, {**extra, START_KEY: start_chunk, LABEL_KEY: label or f"prompt {len(entries) + 1}"}]
    if schedule is None and not entries:
        return [new]
    out = [[e[0], {**e[1], START_KEY: e[1].get(START_KEY, 0)}] for e in entries] + [new]
    return sorted(out, key=lambda e: e[1][START_KEY])
