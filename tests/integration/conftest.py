"""Fixtures for tests that run ComfyUI in this process (tiny Wan models, the pack imported as ComfyUI does).

Every test here is marked ``comfyui`` and ``slow``: importing ComfyUI and building its models takes seconds per
module, so the fast lane (``-m "not slow"``) is the core, routes and static web tests."""

from __future__ import annotations

import pytest
from support import comfyui as support_comfyui

HAVE_COMFYUI = support_comfyui.find_comfyui() is not None


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "integration" in str(item.fspath):
            item.add_marker(pytest.mark.comfyui)
            item.add_marker(pytest.mark.slow)
            if not HAVE_COMFYUI:
                item.add_marker(pytest.mark.skip(reason=support_comfyui.SKIP_REASON))


@pytest.fixture(scope="session")
def comfy():
    """ComfyUI importable in-process on the CPU; returns its folder."""
    if not HAVE_COMFYUI:
        pytest.skip(support_comfyui.SKIP_REASON)
    return support_comfyui.setup_inprocess_comfyui()


@pytest.fixture(scope="session")
def pack(comfy):
    """The pack, imported as the package ``comfyui_jensen_kv``."""
    return support_comfyui.import_pack()


@pytest.fixture(scope="session")
def nodes(pack):
    import importlib

    return importlib.import_module(f"{support_comfyui.PACK_MODULE}.nodes")


@pytest.fixture(scope="session")
def jk(pack):
    """The pack's own ``jensen_core`` (the classes the nodes use)."""
    import importlib

    return importlib.import_module(f"{support_comfyui.PACK_MODULE}.jensen_core")


@pytest.fixture(scope="session")
def magi1(pack):
    """MAGI-1's recipe (its request, run and report), as the family's node file imports it."""
    return support_comfyui.pack_module("runtime.families.magi1.recipe")


@pytest.fixture(scope="session")
def window(pack):
    """MAGI-1 AR Sampler's schedule rules (key ranges, steps, window sizes)."""
    return support_comfyui.pack_module("runtime.families.magi1.window")


@pytest.fixture(scope="session")
def worldplay(pack):
    """HY-WorldPlay's recipe (its request and run), as the family's node file imports it."""
    return support_comfyui.pack_module("runtime.families.worldplay.recipe")


@pytest.fixture
def memory_requests(pack, monkeypatch):
    """The memory_required of every ComfyUI model load in this test (the pack's memory request)."""
    import comfy.model_management as mm

    seen: list[int] = []
    original = mm.load_models_gpu

    def recording(models, memory_required=0, *a, **k):
        seen.append(int(memory_required))
        return original(models, memory_required, *a, **k)

    monkeypatch.setattr(mm, "load_models_gpu", recording)
    return seen


@pytest.fixture(scope="session")
def loop(pack):
    import importlib

    return importlib.import_module(f"{support_comfyui.PACK_MODULE}.runtime.chunk_loop")


@pytest.fixture
def tiny(comfy):
    """A fresh tiny Wan ModelPatcher (fp32, CPU, 2 layers x 2 heads x 32)."""
    from support import wan_tiny

    return wan_tiny.build_patcher(seed=0)


@pytest.fixture(scope="session")
def euler(comfy):
    import comfy.samplers

    return comfy.samplers.sampler_object("euler")


@pytest.fixture(autouse=True)
def _reset_interrupt(request):
    yield
    if "comfy" in request.fixturenames:
        import comfy.model_management

        comfy.model_management.interrupt_current_processing(False)
