"""The CI rule of ``tests/support/ci_skips.py``: under CI=true a skipped ComfyUI / server / browser test fails.

Each case runs a small pytest session in a temporary folder (``pytester``) with the plugin loaded
as ``tests/conftest.py`` loads it.
"""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]

MARKERS = """
[pytest]
markers =
    comfyui: needs ComfyUI
    server: starts a server
    browser: drives Chromium
"""

COMFYUI_SKIP = """
import pytest

@pytest.mark.comfyui
def test_needs_comfyui():
    pytest.skip("ComfyUI not found: set COMFYUI_PATH")

def test_plain():
    pass
"""


def run(pytester, monkeypatch, ci: str | None, files: dict[str, str]):
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    pytester.makeini(MARKERS)
    for name, text in files.items():
        path = pytester.path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return pytester.runpytest_inprocess(
        "-p", "support.ci_skips", "-rs", "-W", "ignore::pytest.PytestAssertRewriteWarning"
    )


@pytest.mark.parametrize("ci", ["true", "1"])
def test_a_skipped_comfyui_test_fails_a_ci_run_and_its_reason_is_printed(pytester, monkeypatch, ci):
    result = run(pytester, monkeypatch, ci, {"test_a.py": COMFYUI_SKIP})
    result.assert_outcomes(passed=1, skipped=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(
        [
            "*CI=true: 1 ComfyUI / server / browser test(s) skipped*",
            "SKIPPED test_a.py::test_needs_comfyui: ComfyUI not found: set COMFYUI_PATH",
        ]
    )


@pytest.mark.parametrize("ci", [None, "false", ""])
def test_without_ci_the_same_skip_passes(pytester, monkeypatch, ci):
    result = run(pytester, monkeypatch, ci, {"test_a.py": COMFYUI_SKIP})
    result.assert_outcomes(passed=1, skipped=1)
    assert result.ret == pytest.ExitCode.OK
    assert "CI=true" not in result.stdout.str()


def test_cuda_skips_are_allowed_under_ci(pytester, monkeypatch):
    code = """
import pytest

@pytest.mark.comfyui
@pytest.mark.cuda
def test_marked_cuda():
    pytest.skip("no device here")

@pytest.mark.server
@pytest.mark.skipif(True, reason="needs CUDA (CPU-only machine)")
def test_reason_says_cuda():
    pass

@pytest.mark.skipif(True, reason="ComfyUI requirements missing")
def test_unmarked_skip_outside_the_required_folders():
    pass
"""
    result = run(pytester, monkeypatch, "true", {"test_a.py": code})
    result.assert_outcomes(skipped=3)
    assert result.ret == pytest.ExitCode.OK


def test_a_cuda_word_in_another_reason_is_not_an_excuse(pytester, monkeypatch):
    code = """
import pytest

@pytest.mark.comfyui
def test_broken_comfyui():
    pytest.skip("Torch not compiled with CUDA enabled")
"""
    result = run(pytester, monkeypatch, "true", {"test_a.py": code})
    assert result.ret == pytest.ExitCode.TESTS_FAILED


@pytest.mark.parametrize("marker", ["server", "browser"])
def test_server_and_browser_markers_count(pytester, monkeypatch, marker):
    code = f"""
import pytest

@pytest.mark.{marker}
@pytest.mark.skipif(True, reason="Chromium not found")
def test_x():
    pass
"""
    result = run(pytester, monkeypatch, "true", {"test_a.py": code})
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["SKIPPED test_a.py::test_x: Chromium not found"])


def test_integration_folder_counts_without_markers_even_when_the_module_skips_at_import(pytester, monkeypatch):
    files = {
        "tests/integration/test_mod.py": "import pytest\npytest.importorskip('no_such_module_jensen_kv')\n",
        "tests/integration/test_fn.py": "import pytest\n\ndef test_x():\n    pytest.skip('gguf missing')\n",
        "tests/test_elsewhere.py": "import pytest\n\ndef test_y():\n    pytest.skip('optional extra missing')\n",
    }
    result = run(pytester, monkeypatch, "true", files)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    out = result.stdout.str()
    assert "CI=true: 2 ComfyUI" in out
    assert "SKIPPED tests/integration/test_mod.py: " in out and "no_such_module_jensen_kv" in out
    assert "SKIPPED tests/integration/test_fn.py::test_x: gguf missing" in out
    assert "SKIPPED tests/test_elsewhere.py::test_y" not in out  # the CI list's format; -rs writes "[1] path:line"


def test_a_failing_run_keeps_its_own_exit_status(pytester, monkeypatch):
    code = COMFYUI_SKIP + "\n\ndef test_fails():\n    assert False\n"
    result = run(pytester, monkeypatch, "true", {"test_a.py": code})
    result.assert_outcomes(passed=1, skipped=1, failed=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED


def test_xfail_is_not_a_skip(pytester, monkeypatch):
    code = """
import pytest

@pytest.mark.comfyui
@pytest.mark.xfail(reason="known")
def test_x():
    assert False
"""
    result = run(pytester, monkeypatch, "true", {"test_a.py": code})
    result.assert_outcomes(xfailed=1)
    assert result.ret == pytest.ExitCode.OK


CORE_AR_TESTS = """
import pytest

@pytest.mark.core_ar
def test_on_core_ar_path():
    pass

def test_plain():
    pass
"""


def fake_comfyui(path, core_ar: bool):
    (path / "comfy" / "ldm" / "wan").mkdir(parents=True)
    (path / "comfy" / "model_patcher.py").write_text("")
    (path / "main.py").write_text("")
    if core_ar:
        (path / "comfy" / "ldm" / "wan" / "ar_model.py").write_text("")
    return path


@pytest.mark.parametrize("ci", ["true", None])
def test_a_core_ar_test_against_comfyui_without_the_ar_path_stops_the_run(pytester, monkeypatch, tmp_path, ci):
    monkeypatch.setenv("COMFYUI_PATH", str(fake_comfyui(tmp_path / "ComfyUI-old", core_ar=False)))
    result = run(pytester, monkeypatch, ci, {"test_a.py": CORE_AR_TESTS})
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.assert_outcomes()  # nothing ran, nothing skipped
    result.stderr.fnmatch_lines(
        [
            "*1 selected test(s) are marked core_ar*ComfyUI-old*comfy/ldm/wan/ar_model.py*",
            "*test_a.py::test_on_core_ar_path*",
        ]
    )


def test_deselecting_core_ar_runs_the_rest_against_comfyui_without_the_ar_path(pytester, monkeypatch, tmp_path):
    monkeypatch.setenv("COMFYUI_PATH", str(fake_comfyui(tmp_path / "ComfyUI-old", core_ar=False)))
    monkeypatch.setenv("CI", "true")
    pytester.makeini(MARKERS)
    (pytester.path / "test_a.py").write_text(CORE_AR_TESTS)
    result = pytester.runpytest_inprocess(
        "-p", "support.ci_skips", "-m", "not core_ar", "-W", "ignore::pytest.PytestAssertRewriteWarning"
    )
    result.assert_outcomes(passed=1, deselected=1)
    assert result.ret == pytest.ExitCode.OK


def test_core_ar_tests_run_where_comfyui_has_the_ar_path_and_may_not_skip_under_ci(pytester, monkeypatch, tmp_path):
    monkeypatch.setenv("COMFYUI_PATH", str(fake_comfyui(tmp_path / "ComfyUI-new", core_ar=True)))
    result = run(pytester, monkeypatch, "true", {"test_a.py": CORE_AR_TESTS})
    result.assert_outcomes(passed=2)
    assert result.ret == pytest.ExitCode.OK
    skipping = CORE_AR_TESTS.replace("    pass\n\ndef test_plain", "    pytest.skip('no AR path')\n\ndef test_plain", 1)
    result = run(pytester, monkeypatch, "true", {"test_a.py": skipping})
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["SKIPPED test_a.py::test_on_core_ar_path: no AR path"])


HUNYUAN15_TESTS = """
import pytest

@pytest.mark.hunyuan15
def test_on_hunyuan15():
    pass

def test_plain():
    pass
"""


def fake_comfyui_hunyuan(path, hunyuan15: bool):
    fake_comfyui(path, core_ar=False)
    body = "class HunyuanVideo(BASE):\n    pass\n" + (
        "class HunyuanVideo15(HunyuanVideo):\n    pass\n" if hunyuan15 else ""
    )
    (path / "comfy" / "supported_models.py").write_text(body)
    return path


def test_a_hunyuan15_test_against_comfyui_without_hunyuanvideo_15_stops_the_run(pytester, monkeypatch, tmp_path):
    monkeypatch.setenv("COMFYUI_PATH", str(fake_comfyui_hunyuan(tmp_path / "ComfyUI-old", hunyuan15=False)))
    result = run(pytester, monkeypatch, "true", {"test_a.py": HUNYUAN15_TESTS})
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.assert_outcomes()
    result.stderr.fnmatch_lines(
        [
            "*1 selected test(s) are marked hunyuan15*HunyuanVideo 1.5*ComfyUI-old*class HunyuanVideo15*",
            "*test_a.py::test_on_hunyuan15*",
        ]
    )


def test_deselecting_hunyuan15_runs_the_rest_and_it_runs_where_comfyui_has_it(pytester, monkeypatch, tmp_path):
    monkeypatch.setenv("COMFYUI_PATH", str(fake_comfyui_hunyuan(tmp_path / "ComfyUI-old", hunyuan15=False)))
    monkeypatch.setenv("CI", "true")
    pytester.makeini(MARKERS)
    (pytester.path / "test_a.py").write_text(HUNYUAN15_TESTS)
    result = pytester.runpytest_inprocess(
        "-p",
        "support.ci_skips",
        "-m",
        "not core_ar and not hunyuan15",
        "-W",
        "ignore::pytest.PytestAssertRewriteWarning",
    )
    result.assert_outcomes(passed=1, deselected=1)
    monkeypatch.setenv("COMFYUI_PATH", str(fake_comfyui_hunyuan(tmp_path / "ComfyUI-new", hunyuan15=True)))
    result = run(pytester, monkeypatch, "true", {"test_a.py": HUNYUAN15_TESTS})
    result.assert_outcomes(passed=2)
    assert result.ret == pytest.ExitCode.OK
