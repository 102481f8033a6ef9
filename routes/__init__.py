"""Server-side HTTP routes of the pack (the web planner's /jensen_kv/options, /spec, /plan).

Kept out of ``web/``: ComfyUI serves WEB_DIRECTORY whole, so nothing but static front-end files may
live there. Registered by the extension's ``on_load`` (``nodes.JensenKVExtension``), never on import.
"""
