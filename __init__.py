"""ComfyUI entry point of comfyui-jensen-kv.

Importable without ComfyUI (so ``pytest`` and ``python -m jensen_core`` work anywhere): the node
classes are imported only when ComfyUI calls :func:`comfy_entrypoint`.
"""

WEB_DIRECTORY = "./web"


async def comfy_entrypoint():
    from .nodes import JensenKVExtension

    return JensenKVExtension()


__all__ = ["WEB_DIRECTORY", "comfy_entrypoint"]
