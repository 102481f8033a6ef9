"""Causal Forcing (thu-ml/Causal-Forcing), frame-wise: chunks of one latent frame, and for the ++ 2-step and 1-step
distillations a first frame on its own 4-step schedule (``denoising_step_list_first_chunk``, chosen for
``block_index == 0`` at ``pipeline/causal_inference.py`` 222-228).

The first chunk's schedule is the sampling's (``first_chunk_sigmas``, or the one AR Video Schedule's
``causal_forcing_framewise_2step`` / ``_1step`` SIGMAS carry); this recipe is picked when a run has one, or when its
SIGMAS are those presets' values without it, and then says loudly that the first frame runs on too few steps.
"""

from __future__ import annotations

import logging

from ..schedules import lost_first_chunk
from .plain import SelfForcing

logger = logging.getLogger("jensen_kv")


def lost_first_schedule(request) -> str | None:
    """The Causal Forcing++ preset whose values a request's frame-wise SIGMAS have while the first chunk of a new
    video has no schedule of its own (it would run on the few steps of the others), else None."""
    sampling = request.sampling
    if sampling.first_chunk_sigmas is not None or request.continuation.resume is not None:
        return None
    if request.chunking.chunk_frames != 1:
        return None
    return lost_first_chunk(sampling.sigmas)


class CausalForcing(SelfForcing):
    """Causal Forcing++: the plain recipe whose video's first chunk takes the first-chunk schedule."""

    name = "causal_forcing"
    label = "Causal Forcing: frame-wise chunks; the ++ 2/1-step distillations' first frame on its own 4 steps"

    def __init__(self, options, recache=None, request=None):
        super().__init__(options, recache)
        self.notes: list[str] = []
        if request is None:
            return
        s = request.sampling
        lost = lost_first_schedule(request)
        if lost is not None:
            steps = s.sigmas.numel() - 1
            note = (
                f"WARNING: these SIGMAS are {lost}'s, whose reference runs the first frame on 4 steps "
                f"(denoising_step_list_first_chunk), but no first-chunk schedule was given: the first frame ran on "
                f"{steps} step(s). Connect AR Video Schedule {lost} straight to sigmas (its SIGMAS carry the first "
                "frame's schedule), or a causal_forcing_framewise_4step schedule to first_chunk_sigmas (the KSampler "
                "node: first_chunk_steps 4)."
            )
            logger.warning("jensen_kv: %s", note)
            self.notes.append(note)
        elif s.first_chunk_sigmas is not None and request.continuation.resume is None:
            how = "carried by the SIGMAS' preset" if s.first_chunk_from == "preset" else "from first_chunk_sigmas"
            self.notes.append(
                f"First chunk on its own schedule ({s.first_chunk_sigmas.numel() - 1} steps, {how}); the others on "
                f"{s.sigmas.numel() - 1}."
            )

    def report(self) -> dict:
        return {**super().report(), "recipe_notes": list(self.notes)}
