"""Jensen KV Cache (Ray): the pack's settings applied inside Raylight's Ray actors (RAY_ACTORS in, RAY_ACTORS out).

Raylight's graph carries RAY_ACTORS, not MODEL: each actor holds its own ModelPatcher and patches it
with a function sent by ``actor.model_function_runner`` (as Raylight's own "(Ray)" nodes do). This node
validates the settings here, sends them as plain data (no pack class crosses the pickle, so the actor
needs nothing of the pack imported beforehand) with a small function that, in each actor, imports
the pack from its folder and does what Quantize KV Cache -> Jensen Bias Correction -> AR Cache Window
do on a MODEL: clone, store the settings, attach the core-AR path. Raylight's Ulysses injection (its
ON_LOAD callback) then meets the pack's, which routes each rank's heads through the pack's cache
(``runtime/families/wan/raylight.py``). docs/raylight.md shows the graph.
"""

from __future__ import annotations

from comfy_api.latest import io, ui

from ..jensen_core import QuantSpec
from ..jensen_core.head_bits import HeadBits
from ..jensen_core.tiers import AgeTiers
from ..runtime.config import JensenKVConfig, get_config, parse_correction, set_config
from ..runtime.core_ar import CacheWindow, attach, set_window
from .ar_cache_window import JensenKVARCacheWindow
from .bias_correction import JensenKVBiasCorrection
from .common import CATEGORY, logger
from .quantize_kv_cache import JensenKVQuantizeKVCache, build_config

RayActors = io.Custom("RAY_ACTORS")
#: Quantize KV Cache's inputs (all but model), then the correction's and the window's, in that order
QUANTIZE_INPUTS = [i.id for i in JensenKVQuantizeKVCache.define_schema().inputs if i.id != "model"]


def settings_payload(config: JensenKVConfig, window: CacheWindow) -> dict:
    """The settings as plain data (dicts, strings, numbers) for the actors."""
    return {
        "spec_k": None if config.spec_k is None else config.spec_k.to_dict(),
        "spec_v": None if config.spec_v is None else config.spec_v.to_dict(),
        "correction": config.correction,
        "strength": float(config.strength),
        "tiers": None if config.tiers is None else config.tiers.to_dict(),
        "head_bits": None if config.head_bits is None else config.head_bits.to_dict(),
        "window_chunks": int(window.window_chunks),
        "sink_chunks": int(window.sink_chunks),
    }


def settings_from_payload(d: dict) -> tuple[JensenKVConfig, CacheWindow]:
    spec = lambda s: None if s is None else QuantSpec.from_dict(s)  # noqa: E731
    config = JensenKVConfig(
        spec_k=spec(d["spec_k"]),
        spec_v=spec(d["spec_v"]),
        correction=d["correction"],
        strength=float(d["strength"]),
        tiers=None if d["tiers"] is None else AgeTiers.from_dict(d["tiers"]),
        head_bits=None if d.get("head_bits") is None else HeadBits(**d["head_bits"]),
    )
    return config, CacheWindow(int(d["window_chunks"]), int(d["sink_chunks"]))


def apply_settings(model, payload: dict):
    """In an actor: a clone of ``model`` carrying the settings, attached to core's AR path (what the three nodes do)."""
    config, window = settings_from_payload(payload)
    upstream = get_config(model.model_options)
    if upstream is not None and upstream != config:
        logger.info("jensen_kv: Ray actor: replacing the Jensen KV settings %s", upstream.describe())
    m = model.clone()
    set_config(m, config)
    set_window(m, window)
    attach(m)
    logger.info("jensen_kv: Ray actor: KV cache %s; %s", config.describe(), window.describe())
    return m


def actor_function(package: str, folder: str):
    """The function each actor runs on its model. A closure, so Ray's cloudpickle sends it by value: in the actor
    it imports the pack from ``folder`` under ``package`` (as ComfyUI names it) when the actor has not."""

    def apply_jensen_kv(model, payload):
        import importlib
        import importlib.util
        import os
        import sys

        if package not in sys.modules:
            where = folder if os.path.isdir(folder) else os.path.join("custom_nodes", os.path.basename(folder))
            spec = importlib.util.spec_from_file_location(
                package, os.path.join(where, "__init__.py"), submodule_search_locations=[where]
            )
            module = importlib.util.module_from_spec(spec)
            sys.modules[package] = module
            spec.loader.exec_module(module)
        return importlib.import_module(f"{package}.nodes.ray_actors_kv").apply_settings(model, payload)

    return apply_jensen_kv


def _pack() -> tuple[str, str]:
    """This pack's package name (ComfyUI's) and folder."""
    import os

    package = __name__.rsplit(".nodes.", 1)[0]
    return package, os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class JensenKVRayActors(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        quantize = [i for i in JensenKVQuantizeKVCache.define_schema().inputs if i.id != "model"]
        correction = [i for i in JensenKVBiasCorrection.define_schema().inputs if i.id != "model"]
        window = [i for i in JensenKVARCacheWindow.define_schema().inputs if i.id != "model"]
        return io.Schema(
            node_id="JensenKVRayActors",
            display_name="Jensen KV Cache (Ray)",
            category=CATEGORY,
            description=(
                "Quantize KV Cache, Jensen Bias Correction and AR Cache Window applied inside Raylight's Ray actors: "
                "each GPU's model gets the pack's cache on core's SamplerARVideo; under Ulysses each GPU holds its "
                "heads' share. Use Raylight's samplers with SamplerARVideo after it."
            ),
            inputs=[
                RayActors.Input(
                    "ray_actors", tooltip="Raylight's actors with the model loaded (Load Diffusion Model (Ray))."
                ),
                *quantize,
                *correction,
                *window,
            ],
            outputs=[RayActors.Output(tooltip="The same actors, their models carrying the Jensen KV cache settings.")],
        )

    @classmethod
    def execute(
        cls, ray_actors, mode="taylor", strength=1.0, window_chunks=0, sink_chunks=0, **quantize
    ) -> io.NodeOutput:
        config = build_config(None, **{k: v for k, v in quantize.items() if k in QUANTIZE_INPUTS})
        if config.keys_quantized:
            config = config.with_correction(parse_correction(mode), strength)
        window = CacheWindow(int(window_chunks), int(sink_chunks))
        workers = (ray_actors or {}).get("workers") if isinstance(ray_actors, dict) else None
        if not workers:
            raise ValueError(
                "ray_actors holds no Ray workers: connect the RAY_ACTORS output of Raylight's Load Diffusion Model "
                "(Ray) (after its Ray Init Actor)"
            )
        import ray

        fn = actor_function(*_pack())
        payload = settings_payload(config, window)
        ray.get([actor.model_function_runner.remote(fn, payload) for actor in workers])
        text = f"KV cache in {len(workers)} Ray actor(s): {config.describe()}; {window.describe()}"
        logger.info("jensen_kv: %s", text)
        return io.NodeOutput(ray_actors, ui=ui.PreviewText(text))
