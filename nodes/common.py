"""Shared bits of the node schemas: category, the report link type, advanced inputs, node messages."""

from __future__ import annotations

import inspect
import logging

from comfy_api.latest import io

logger = logging.getLogger("jensen_kv")

CATEGORY = "jensen_kv"

#: The link type of the Chunked AR sampler's report (a dict, see ``runtime.report.build_report``).
JensenKVReport = io.Custom("JENSEN_KV_REPORT")

#: The state of a Chunked AR run to continue later (``runtime.saved_run.SavedRun``): sampler output and input,
#: Save KV Cache / Load KV Cache.
JensenKVCache = io.Custom("JENSEN_KV_CACHE")

#: A checked HY-WorldPlay camera path (``runtime.families.worldplay.model.trajectory.Trajectory``): HY-WorldPlay Trajectory's output.
WorldPlayTrajectory = io.Custom("WORLDPLAY_TRAJECTORY")

UI_REPORT_KEY = "jensen_kv_report"


def output_connected(node_cls, output_index: int) -> bool:
    """Whether any node of the running prompt takes output ``output_index`` of this node (hidden prompt + id).

    Unknown (no prompt, e.g. called outside a server) counts as connected, so nothing is lost.
    """
    hidden = getattr(node_cls, "hidden", None)
    prompt, node_id = getattr(hidden, "prompt", None), getattr(hidden, "unique_id", None)
    if not isinstance(prompt, dict) or node_id is None:
        return True
    for node in prompt.values():
        for value in (node.get("inputs") or {}).values():
            if (
                isinstance(value, list)
                and len(value) == 2
                and str(value[0]) == str(node_id)
                and value[1] == output_index
            ):
                return True
    return False


def advanced(inp: io.Input) -> io.Input:
    """Mark an input as an expert knob: ``advanced=True`` where this ComfyUI knows it, else in the schema dict."""
    if "advanced" in inspect.signature(type(inp).__init__).parameters or hasattr(inp, "advanced"):
        inp.advanced = True
    inp.extra_dict["advanced"] = True
    return inp


def node_message(node_cls, text: str) -> None:
    """Show ``text`` on the running node in the UI (no-op outside a server)."""
    node_id = getattr(getattr(node_cls, "hidden", None), "unique_id", None)
    if node_id is None:
        return
    try:
        from server import PromptServer

        server = getattr(PromptServer, "instance", None)
        if server is not None:
            server.send_progress_text(text, node_id)
    except Exception:  # noqa: BLE001 - a UI nicety must never fail the node
        logger.debug("jensen_kv: could not send progress text", exc_info=True)


def check_combo_values(node_cls, **values) -> bool | str:
    """``validate_inputs`` body: every Combo value must be one of its options.

    ComfyUI v0.3.64 validates V1 combo lists but not V3 ``io.Combo`` inputs, so a prompt with, say,
    ``group_size: "48"`` would otherwise reach ``execute``. Linked (not yet known) values are None.
    """
    problems = []
    for inp in node_cls.define_schema().inputs:
        if isinstance(inp, io.Combo.Input) and values.get(inp.id) is not None:
            value = values[inp.id]
            if value not in inp.options:
                shown = inp.options if len(inp.options) <= 20 else f"{len(inp.options)} options"
                problems.append(f"{inp.id}: {value!r} is not one of {shown}")
    return True if not problems else "; ".join(problems)
