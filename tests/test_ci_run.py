""".ci/run, executed with a stand-in Python that records what it is asked to do (nothing is installed).

The script is copied into a throwaway checkout next to fake ``shared/ComfyUI`` trees, so these tests
see which ComfyUI it picks (the order of ``tests/support/comfyui.py``), what it installs, and the
environment the README's test command runs in.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

FAKE_PYTHON = """#!/usr/bin/env bash
log="$(dirname "$0")/calls.log"
echo "CALL $*" >> "$log"
if [ "$1 $2" = "-m pytest" ]; then
  echo "ENV CI=${CI:-} COMFYUI_PATH=${COMFYUI_PATH:-} COMFYUI_GGUF_PATH=${COMFYUI_GGUF_PATH:-}" >> "$log"
fi
prev=""
for a in "$@"; do
  if [ "$prev" = "-r" ]; then sed 's/^/REQ /' "$a" >> "$log"; fi
  prev="$a"
done
exit 0
"""

COMFY_REQUIREMENTS = "comfyui-frontend-package==1.27.10\ntorch\ntorchsde\ntorchvision\ntorchaudio\ntorch>=2.1\nnumpy>=1.25.0\n"


def fake_comfyui(path: Path) -> Path:
    (path / "comfy").mkdir(parents=True)
    (path / "comfy" / "model_patcher.py").write_text("")
    (path / "main.py").write_text("")
    (path / "requirements.txt").write_text(COMFY_REQUIREMENTS)
    return path


def fake_gguf_pack(path: Path) -> Path:
    path.mkdir(parents=True)
    for f in ("loader.py", "nodes.py", "ops.py"):
        (path / f).write_text("")
    return path


@pytest.fixture
def sandbox(tmp_path):
    """tmp/work/checkout/.ci/run, a fake python, and stand-ins for apt-get / sudo on PATH."""
    checkout = tmp_path / "work" / "checkout"
    (checkout / ".ci").mkdir(parents=True)
    shutil.copy2(ROOT / ".ci" / "run", checkout / ".ci" / "run")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    py = bin_dir / "python"
    py.write_text(FAKE_PYTHON)
    py.chmod(0o755)
    for tool in ("apt-get", "sudo"):
        stub = bin_dir / tool
        stub.write_text(f'#!/usr/bin/env bash\necho "CALL {tool} $*" >> "$(dirname "$0")/calls.log"\n')
        stub.chmod(0o755)
    return tmp_path, checkout, bin_dir


def run_ci(sandbox, **env):
    tmp, checkout, bin_dir = sandbox
    environ = {k: v for k, v in os.environ.items() if k not in ("COMFYUI_PATH", "COMFYUI_GGUF_PATH", "CI")}
    environ.update(PYTHON=str(bin_dir / "python"), PATH=f"{bin_dir}:{environ['PATH']}", **env)
    r = subprocess.run(["bash", str(checkout / ".ci" / "run")], capture_output=True, text=True, env=environ,
                       timeout=120)
    log = bin_dir / "calls.log"
    return r, (log.read_text().splitlines() if log.exists() else [])


def test_finds_shared_comfyui_next_to_the_checkout_and_runs_the_readme_command_under_ci(sandbox):
    tmp, checkout, _ = sandbox
    shared = fake_comfyui(tmp / "work" / "shared" / "ComfyUI")
    fake_comfyui(tmp / "ComfyUI-above")  # not a parent: ignored
    gguf = fake_gguf_pack(tmp / "work" / "shared" / "ComfyUI-GGUF")
    r, calls = run_ci(sandbox)
    assert r.returncode == 0, r.stderr
    assert f"ComfyUI: {shared}" in r.stdout
    installs = [c for c in calls if c.startswith("CALL -m pip install")]
    assert "torch==2.14.1" in installs[0] and "torchvision==0.29.1" in installs[0]
    assert installs[1].endswith('-e .[test,browser]')
    assert installs[2].endswith("requests") and " -r " in installs[2]
    reqs = [c.removeprefix("REQ ") for c in calls if c.startswith("REQ ")]
    assert reqs == ["comfyui-frontend-package==1.27.10", "torchsde", "numpy>=1.25.0"]
    assert calls[-2] == "CALL -m pytest -q"  # the README's test command, last
    assert calls[-1] == f"ENV CI=true COMFYUI_PATH={shared} COMFYUI_GGUF_PATH={gguf}"


def test_comfyui_path_wins_and_a_comfyui_above_the_checkout_is_found(sandbox):
    tmp, checkout, _ = sandbox
    fake_comfyui(tmp / "work" / "shared" / "ComfyUI")
    chosen = fake_comfyui(tmp / "elsewhere" / "ComfyUI")
    r, calls = run_ci(sandbox, COMFYUI_PATH=str(chosen))
    assert r.returncode == 0 and calls[-1].startswith(f"ENV CI=true COMFYUI_PATH={chosen} "), r.stderr

    # no env, no shared/: the checkout lives in ComfyUI/custom_nodes/<pack>
    comfy = fake_comfyui(tmp / "work")
    shutil.rmtree(tmp / "work" / "shared")
    r, calls = run_ci(sandbox)
    assert r.returncode == 0 and calls[-1].startswith(f"ENV CI=true COMFYUI_PATH={comfy} "), r.stderr


def test_no_comfyui_stops_before_the_tests(sandbox):
    if Path("/opt/ComfyUI/main.py").is_file():
        pytest.skip("this machine has /opt/ComfyUI, which .ci/run would use")
    r, calls = run_ci(sandbox, COMFYUI_PATH="/nonexistent")
    assert r.returncode == 1
    assert "ComfyUI not found" in r.stderr and "fails the run" in r.stderr
    assert not any(c.startswith("CALL -m pytest") for c in calls)
