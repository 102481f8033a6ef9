"""The web extension (``jensen_kv.js``, served by ComfyUI from WEB_DIRECTORY) and the HTTP routes it asks (``routes``)."""
