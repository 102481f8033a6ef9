"""Finding a ComfyUI checkout, importing it in-process, and running a throwaway ComfyUI server, for tests and
benchmarks (the tests' one server per session: ``tests/support/shared_server.py``).

ComfyUI is not on PyPI and is never kept in the repo or in ``../shared/``: a user's own ComfyUI holds the pack
in ``ComfyUI/custom_nodes/<pack>``, and test machines lay the trees out from git mirrors with
``bash ../shared/comfyui/lay-out.sh [MIRRORS]`` under ``/opt/comfyui`` (``v0.33``, ``v0.27``, ``v0.3.64``).
ComfyUI is looked up, in order, through ``COMFYUI_PATH``, by walking up from the pack (the folders above the
checkout), then under ``COMFYUI_TREES`` (default ``/opt/comfyui``), newest first. One pytest process imports
one ComfyUI: ``.ci/run`` runs the suite against 0.33 and, with ``COMFYUI_PATH`` set, its ComfyUI tests against
v0.27 and v0.3.64. Tests that need ComfyUI skip with the reason when none is found, and under ``CI=true`` such a
skip fails the run (see ``tests/support/ci_skips.py``).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

PACK_ROOT = Path(__file__).resolve().parents[1]
PACK_DIRNAME = "comfyui-jensen-kv"
TEST_NODES_DIR = PACK_ROOT / "tests" / "comfy_test_nodes"


#: where ``../shared/comfyui/lay-out.sh`` lays the trees out (``COMFYUI_TREES`` overrides it)
DEFAULT_TREES = Path("/opt/comfyui")
#: the laid-out versions, newest first: 0.33 (the newest), v0.27 (core's AR path appears), v0.3.64 (the oldest)
TREE_VERSIONS = ("v0.33", "v0.27", "v0.3.64")
LAY_OUT_HINT = "bash ../shared/comfyui/lay-out.sh [MIRRORS] (docs/testing.md, 'On a fresh machine')"


def trees_dir() -> Path:
    return Path(os.environ.get("COMFYUI_TREES") or DEFAULT_TREES)


def laid_out_tree(version: str) -> Path:
    """Where lay-out.sh puts ComfyUI ``version`` (e.g. ``v0.27``), whether or not it is there."""
    return trees_dir() / version


def _is_comfyui(p: Path) -> bool:
    return (p / "comfy" / "model_patcher.py").is_file() and (p / "main.py").is_file()


def locate_comfyui() -> Path | None:
    """The first ComfyUI checkout found, importable or not."""
    env = os.environ.get("COMFYUI_PATH")
    if env and _is_comfyui(Path(env)):
        return Path(env).resolve()
    for parent in PACK_ROOT.parents:
        if _is_comfyui(parent):
            return parent
    for version in TREE_VERSIONS:
        tree = laid_out_tree(version)
        if _is_comfyui(tree):
            return tree.resolve()
    return None


# modules every supported ComfyUI imports at start-up (requirements.txt, plus requests, which v0.3.64 imports but
# does not list)
_COMFYUI_MODULES = (
    "aiohttp",
    "yarl",
    "yaml",
    "PIL",
    "scipy",
    "tqdm",
    "psutil",
    "alembic",
    "sqlalchemy",
    "av",
    "torchsde",
    "torchvision",
    "einops",
    "transformers",
    "tokenizers",
    "sentencepiece",
    "safetensors",
    "kornia",
    "spandrel",
    "pydantic",
    "pydantic_settings",
    "comfyui_frontend_package",
    "requests",
)
# modules newer ComfyUI needs too, required where its requirements.txt lists them (checked on v0.27): main.py and
# comfy.model_management import comfy_aimdo; without comfy_kitchen, loading even a bf16 Wan fails
# (comfy.quant_ops.ck); comfy.sd imports torchaudio (the LTX audio VAE), which v0.3.64 lists but runs without
_LISTED_MODULES = {"comfy-aimdo": "comfy_aimdo", "comfy-kitchen": "comfy_kitchen", "torchaudio": "torchaudio"}
_TORCHAUDIO_NEEDED_FROM = (0, 27)
_REQUIREMENT_NAME = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def comfyui_version(comfy_dir: Path) -> tuple[int, ...] | None:
    """``__version__`` of ``comfyui_version.py`` as a tuple, e.g. (0, 27, 0); None when it cannot be read."""
    try:
        text = (comfy_dir / "comfyui_version.py").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.strip().startswith("__version__"):
            try:
                return tuple(int(x) for x in line.split("=", 1)[1].strip().strip("\"'").split("."))
            except ValueError:
                return None
    return None


def required_modules(comfy_dir: Path) -> tuple[str, ...]:
    """The modules the ComfyUI at ``comfy_dir`` needs to start and to run the tests' models."""
    try:
        lines = (comfy_dir / "requirements.txt").read_text().splitlines()
    except OSError:
        lines = []
    listed = {m.group(1).lower() for m in map(_REQUIREMENT_NAME.match, lines) if m}
    extra = [m for req, m in _LISTED_MODULES.items() if req in listed]
    version = comfyui_version(comfy_dir)
    if "torchaudio" in extra and (version is None or version < _TORCHAUDIO_NEEDED_FROM):
        extra.remove("torchaudio")
    return (*_COMFYUI_MODULES, *extra)


def missing_comfyui_requirements(comfy_dir: Path | None = None) -> list[str]:
    mods = required_modules(comfy_dir) if comfy_dir is not None else _COMFYUI_MODULES
    return [m for m in mods if importlib.util.find_spec(m) is None]


_LOCATED = locate_comfyui()
_MISSING = missing_comfyui_requirements(_LOCATED) if _LOCATED is not None else []


def find_comfyui() -> Path | None:
    """A ComfyUI checkout that can run here (its requirements installed), else None (see SKIP_REASON)."""
    return _LOCATED if _LOCATED is not None and not _MISSING else None


if _LOCATED is None:
    SKIP_REASON = (
        "ComfyUI not found: set COMFYUI_PATH, install the pack under ComfyUI/custom_nodes/, or lay the trees out "
        f"under {trees_dir()} from git mirrors with {LAY_OUT_HINT}"
    )
else:
    SKIP_REASON = (
        f"ComfyUI found at {_LOCATED} but its requirements are not installed ({', '.join(_MISSING)} missing): "
        f"pip install -r {_LOCATED}/requirements.txt requests"
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_base_dir(base: Path, extra_custom_nodes: list[Path] = ()) -> Path:
    """A ComfyUI base directory with this pack (and optional test-only packs) in custom_nodes."""
    for sub in (
        "custom_nodes",
        "models/diffusion_models",
        "models/vae",
        "models/text_encoders",
        "input",
        "output",
        "temp",
        "user",
    ):
        (base / sub).mkdir(parents=True, exist_ok=True)
    link = base / "custom_nodes" / PACK_DIRNAME
    if not link.exists():
        link.symlink_to(PACK_ROOT, target_is_directory=True)
    for extra in extra_custom_nodes:
        dst = base / "custom_nodes" / extra.name
        if not dst.exists():
            dst.symlink_to(extra.resolve(), target_is_directory=True)
    return base


class ComfyServer:
    """A ComfyUI server process on a free loopback port; use as a context manager."""

    def __init__(
        self,
        comfy_dir: Path,
        base_dir: Path,
        extra_args: list[str] = (),
        startup_timeout: float = 180.0,
        env: dict[str, str] | None = None,
    ):
        self.comfy_dir = comfy_dir
        self.base_dir = base_dir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = base_dir / "server.log"
        self.extra_args = list(extra_args)
        self.startup_timeout = startup_timeout
        self.env = dict(env or {})
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> ComfyServer:
        cmd = [
            sys.executable,
            str(self.comfy_dir / "main.py"),
            "--cpu",
            "--listen",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--base-directory",
            str(self.base_dir),
            "--disable-auto-launch",
            "--database-url",
            "sqlite:///:memory:",
            *self.extra_args,
        ]
        self._log = open(self.log_path, "w")
        env = dict(os.environ, PYTHONUNBUFFERED="1", **self.env)
        self.proc = subprocess.Popen(
            cmd, cwd=self.comfy_dir, stdout=self._log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"ComfyUI exited with {self.proc.returncode} during start-up:\n{self.log_tail()}")
            try:
                self.get("/object_info/KSampler", timeout=5)
                return self
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                time.sleep(0.5)
        self.__exit__(None, None, None)
        raise RuntimeError(f"ComfyUI did not answer within {self.startup_timeout:.0f} s:\n{self.log_tail()}")

    def __exit__(self, *exc) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, 15)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, 9)
                self.proc.wait(timeout=10)
        if getattr(self, "_log", None):
            self._log.close()

    def log_tail(self, n: int = 80) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"

    def get(self, path: str, timeout: float = 30):
        with urllib.request.urlopen(self.url + path, timeout=timeout) as r:
            return json.loads(r.read() or b"null")

    def post(self, path: str, payload: dict | None = None, timeout: float = 30):
        data = json.dumps(payload or {}).encode()
        req = urllib.request.Request(self.url + path, data=data, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                body = r.read()
                return r.status, json.loads(body) if body else None
        except urllib.error.HTTPError as e:
            body = e.read()
            try:
                return e.code, json.loads(body)
            except ValueError:
                return e.code, body.decode(errors="replace")

    def run_prompt(
        self, prompt: dict, timeout: float = 600, client_id: str = "jensen-kv-tests", status: str = "success"
    ) -> dict:
        """Queue ``prompt`` (API format), check it was accepted with no node errors, wait for it and check it ended
        as ``status`` says (``"success"``, or ``"error"`` for a run that must fail; the server's log tail in the
        message otherwise); its history entry."""
        code, body = self.post("/prompt", {"prompt": prompt, "client_id": client_id})
        assert code == 200 and body["node_errors"] == {}, body
        entry = self.wait_for_prompt(body["prompt_id"], timeout=timeout)
        assert entry["status"]["status_str"] == status, (entry["status"], self.log_tail())
        return entry

    def wait_for_prompt(self, prompt_id: str, timeout: float = 600) -> dict:
        """Poll /history until the prompt finishes; return its history entry."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            hist = self.get(f"/history/{prompt_id}")
            if hist and prompt_id in hist and hist[prompt_id].get("status", {}).get("completed") is not None:
                entry = hist[prompt_id]
                if entry["status"].get("status_str") in ("success", "error") or entry["status"]["completed"]:
                    return entry
            if self.proc.poll() is not None:
                raise RuntimeError(f"ComfyUI died while running the prompt:\n{self.log_tail()}")
            time.sleep(0.5)
        raise TimeoutError(f"prompt {prompt_id} did not finish in {timeout:.0f} s:\n{self.log_tail()}")


def which_chromium() -> str | None:
    for c in ("/usr/bin/chromium", "/usr/bin/chromium-browser", shutil.which("chromium") or ""):
        if c and Path(c).is_file():
            return c
    return None


# ----------------------------------------------------------------------------- in-process ComfyUI
PACK_MODULE = "comfyui_jensen_kv"


def setup_inprocess_comfyui(cpu: bool = True) -> Path:
    """Make ComfyUI importable in this process, on the CPU (``args.cpu`` set before model_management loads).

    ``cpu=False`` leaves ComfyUI's device choice (benchmarks on a GPU).

    ComfyUI's folder goes first on ``sys.path`` so that its top-level ``nodes`` module wins over the
    pack's ``nodes`` package (the pack itself is imported as :data:`PACK_MODULE`, see :func:`import_pack`).
    """
    comfy_dir = find_comfyui()
    if comfy_dir is None:
        raise RuntimeError(SKIP_REASON)
    if str(comfy_dir) not in sys.path:
        sys.path.insert(0, str(comfy_dir))
    import comfy.cli_args

    comfy.cli_args.args.cpu = cpu
    return comfy_dir


def pack_module(name: str):
    """A module of the pack as ComfyUI imports it (``pack_module("runtime.families.magi1.recipe")``; the pack
    imported first: :func:`import_pack`, which this calls)."""
    import_pack()
    return importlib.import_module(f"{PACK_MODULE}.{name}")


def import_pack():
    """Import this pack as the package ``comfyui_jensen_kv`` (as ComfyUI does, so relative imports work)."""
    import importlib.util

    if PACK_MODULE in sys.modules:
        return sys.modules[PACK_MODULE]
    spec = importlib.util.spec_from_file_location(
        PACK_MODULE, PACK_ROOT / "__init__.py", submodule_search_locations=[str(PACK_ROOT)]
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[PACK_MODULE] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[PACK_MODULE]
        raise
    return module
