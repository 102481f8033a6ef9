"""What a run sends to ComfyUI's progress bar, and what ComfyUI passes on to the front end.

The pack calls ``comfy.utils.ProgressBar.update_absolute`` once per step (``sent``). ComfyUI hands
an update to its progress hook, which becomes the websocket ``progress`` message (``shown``):
v0.3.64 every one; newer ComfyUI (v0.27) throttles them, passing on the first, the final, every one
that carries a preview, and others only 100 ms and 0.5 % after the last one it passed on. So tests
check ``sent`` exactly and ``shown`` as ComfyUI's own rule allows (:meth:`Progress.assert_shown_follows_sent`).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field


def comfyui_throttles_progress() -> bool:
    """This ComfyUI drops some progress updates on their way to the hook (v0.27 does, v0.3.64 does not)."""
    import comfy.utils

    return hasattr(comfy.utils, "PROGRESS_THROTTLE_MIN_INTERVAL")


@dataclass
class Progress:
    sent: list = field(default_factory=list)  # (value, total, preview) given to update_absolute
    shown: list = field(default_factory=list)  # (value, total, preview) that reached the hook

    def assert_shown_follows_sent(self) -> None:
        """The hook saw the updates in order, the first and the final one and each one with a preview;
        all of them where ComfyUI does not throttle."""
        assert self.sent, "the run sent no progress"
        assert self.shown, "no progress update reached ComfyUI's hook"
        if not comfyui_throttles_progress():
            assert [(v, t) for v, t, _ in self.shown] == [(v, t) for v, t, _ in self.sent]
            return
        sent_values = [v for v, _, _ in self.sent]
        values = [v for v, _, _ in self.shown]
        assert values == sorted(set(values)) and set(values) <= set(sent_values), (values, sent_values)
        assert self.shown[0][:2] == self.sent[0][:2] and self.shown[-1][:2] == self.sent[-1][:2]
        with_preview = [(v, t) for v, t, p in self.sent if p is not None]
        assert with_preview == [(v, t) for v, t, p in self.shown if p is not None]


@contextlib.contextmanager
def record_progress():
    """Record a run's progress (``sent`` and ``shown``); restores ComfyUI's ProgressBar and hook after."""
    import comfy.utils

    rec = Progress()
    real_bar, old_hook = comfy.utils.ProgressBar, comfy.utils.PROGRESS_BAR_HOOK

    class RecordingProgressBar(real_bar):
        def update_absolute(self, value, total=None, preview=None):
            rec.sent.append((value, self.total if total is None else total, preview))
            return super().update_absolute(value, total, preview)

    comfy.utils.set_progress_bar_global_hook(
        lambda value, total, preview, node_id=None: rec.shown.append((value, total, preview))
    )
    comfy.utils.ProgressBar = RecordingProgressBar
    try:
        yield rec
    finally:
        comfy.utils.ProgressBar = real_bar
        comfy.utils.set_progress_bar_global_hook(old_hook)
