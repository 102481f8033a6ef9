"""Model families the pack's samplers drive, chosen by probing the MODEL: one package per family.

- ``base.py``: the interface a family implements (:class:`~.base.ModelFamily`) and :func:`~.base.register`;
- ``registry.py``: the registry (``FAMILIES``, ``detect``, ``attention_shape``, ``planner_presets``, ...), which
  finds the family packages in this folder and names none;
- ``<key>/``: one family (``wan/``, ``worldplay/``, ``magi1/``): its pure-torch ``model/`` where it has its own (no
  ComfyUI; it imports nothing of the pack outside itself), ``family.py`` (its ModelFamily, ending in its one
  registration line), ``recipe.py`` where its loop differs from the Chunked AR loop, and its ComfyUI glue.

This file imports nothing, so a family's ``model/`` imports on its own (``runtime.families.magi1.model.dit`` with the
pack root on ``sys.path``, as the tests and tools import it). The registry's names are read from ``registry.py`` the
first time one is asked for (``from ..runtime.families import detect``).
"""

from __future__ import annotations


def __getattr__(name: str):
    import importlib

    if name.startswith("__") or name == "registry":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    registry = importlib.import_module(f"{__name__}.registry")
    try:
        return getattr(registry, name)
    except AttributeError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
