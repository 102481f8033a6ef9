"""The causal-fast DMD schedule of LingBot-World 2.0 (robbyant/lingbot-world-v2 ``wan/image2video.py``
``_generate_causal_fast`` with ``wan/utils/fm_solvers_unipc.py``), in pure torch.

The reference builds a 1000-step flow-matching table at ``shift`` and takes four of its entries
(``timesteps_index``; the official CLI run: ``[0, 250, 500, 750]`` at shift 10 -> t = 999, 967, 908, 768):

- the **integer** timestep goes into the DiT's time embedding;
- x0 = x_t - sigma v uses the sigma of the *first* table entry with that integer timestep
  (``_convert_flow_pred_to_x0``: ``argmin |timesteps - t|``), in float64;
- the re-noise to the next timestep, ``(1 - sigma) x0 + sigma noise``, uses the sigma of the *second* entry with that
  timestep where it repeats (``add_noise`` -> ``index_for_timestep``), in the latent's dtype.

Both tables are reproduced here, entry for entry: the sigmas are numpy's ``linspace(sigma_max, 0, 1001)[:-1]``
(``i * step + start``) shifted in float64 and rounded to float32, sigma_max the float32 ``1 - 1/1000``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

NUM_TRAIN_TIMESTEPS = 1000
#: the official CLI run (generate.py: shift from the config, timesteps_index left at generate()'s default)
DEFAULT_SHIFT = 10.0
DEFAULT_INDICES = (0, 250, 500, 750)
#: the function default of ``_generate_causal_fast`` (also SGLang's and the 1.0 Fast model's)
ALT_INDICES = (0, 179, 358, 679)


def flow_tables(shift: float) -> tuple[Tensor, Tensor]:
    """The scheduler's tables after ``set_timesteps(1000, shift=shift)``: sigmas (float32, 1000 entries; the
    appended final 0 left out) and integer timesteps (int64)."""
    sigma_max = float(torch.tensor(1.0 - 1.0 / NUM_TRAIN_TIMESTEPS, dtype=torch.float32))
    n = NUM_TRAIN_TIMESTEPS
    step = (0.0 - sigma_max) / n
    s = torch.arange(n + 1, dtype=torch.float64) * step + sigma_max
    s[-1] = 0.0
    s = s[:-1]
    s = shift * s / (1 + (shift - 1) * s)
    timesteps = (s * NUM_TRAIN_TIMESTEPS).to(torch.int64)  # numpy's astype: truncation toward zero
    return s.to(torch.float32), timesteps


@dataclass(frozen=True)
class DMDSchedule:
    """The steps of one chunk: ``timesteps`` (integers the DiT sees), ``sigmas_x0`` (x0 conversion, per step) and
    ``sigmas_noise`` (the re-noise *to* each step's timestep, per step; the first is unused)."""

    timesteps: tuple[int, ...]
    sigmas_x0: tuple[float, ...]
    sigmas_noise: tuple[float, ...]
    shift: float
    indices: tuple[int, ...]

    @property
    def steps(self) -> int:
        return len(self.timesteps)

    def to_x0(self, step: int, x: Tensor, v: Tensor) -> Tensor:
        """x0 = x_t - sigma v, in float64 (as the reference), returned in ``v``'s dtype."""
        return (x.double() - self.sigmas_x0[step] * v.double()).to(v.dtype)

    def renoise(self, step: int, x0: Tensor, noise: Tensor) -> Tensor:
        """x0 noised to step ``step``'s timestep: ``(1 - sigma) x0 + sigma noise`` in ``x0``'s dtype."""
        sigma = torch.tensor(self.sigmas_noise[step], dtype=x0.dtype, device=x0.device)
        return (1 - sigma) * x0 + sigma * noise


def dmd_schedule(shift: float = DEFAULT_SHIFT, indices=DEFAULT_INDICES) -> DMDSchedule:
    """The schedule of ``indices`` into the 1000-entry table at ``shift``. ValueError naming the fix for indices out of
    range or not strictly increasing."""
    indices = tuple(int(i) for i in indices)
    if not indices or any(i < 0 or i >= NUM_TRAIN_TIMESTEPS for i in indices) or list(indices) != sorted(set(indices)):
        raise ValueError(
            f"timestep indices {list(indices)} must be strictly increasing whole numbers from 0 to "
            f"{NUM_TRAIN_TIMESTEPS - 1} (the reference's {list(DEFAULT_INDICES)})"
        )
    if not shift > 0:
        raise ValueError(f"shift={shift} must be positive (the reference's {DEFAULT_SHIFT})")
    sigmas, table = flow_tables(float(shift))
    ts = [int(table[i]) for i in indices]
    first = [int(torch.nonzero(table == t)[0]) for t in ts]
    hits = [torch.nonzero(table == t).flatten() for t in ts]
    second = [int(h[1]) if h.numel() > 1 else int(h[0]) for h in hits]
    return DMDSchedule(
        timesteps=tuple(ts),
        sigmas_x0=tuple(float(sigmas[i]) for i in first),
        sigmas_noise=tuple(float(sigmas[i]) for i in second),
        shift=float(shift),
        indices=indices,
    )


def parse_indices(text: str) -> tuple[int, ...]:
    """``"0,250,500,750"`` -> (0, 250, 500, 750); ValueError naming the fix."""
    try:
        out = tuple(int(p) for p in str(text).replace(" ", "").split(",") if p)
    except ValueError:
        out = ()
    if not out:
        raise ValueError(
            f"timestep_indices={text!r}: give comma-separated whole numbers, e.g. {','.join(map(str, DEFAULT_INDICES))}"
        )
    return out


__all__ = [
    "ALT_INDICES",
    "DEFAULT_INDICES",
    "DEFAULT_SHIFT",
    "DMDSchedule",
    "dmd_schedule",
    "flow_tables",
    "parse_indices",
]
