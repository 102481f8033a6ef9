"""runtime/peak_memory.py: the run's peak memory above its start, from the process's resident peak on a CPU (Linux) or
the CUDA allocator; its report entry and text line."""

from __future__ import annotations

import mmap
import sys
from pathlib import Path

import pytest
from support.pack import load_pack_module

peak_memory = load_pack_module("runtime.peak_memory")


def _status(path: Path, rss_kb: int, hwm_kb: int) -> None:
    path.write_text(f"Name:\tpython\nVmHWM:\t{hwm_kb} kB\nVmRSS:\t{rss_kb} kB\n")


def test_cpu_peak_is_the_resident_peak_above_the_start_after_a_reset(tmp_path):
    status, clear = tmp_path / "status", tmp_path / "clear_refs"
    _status(status, rss_kb=1000, hwm_kb=9000)  # a peak from before the run: the reset must drop it
    clear.write_text("")
    meter = peak_memory.PeakMeter("cpu", status=status, clear_refs=clear).start()
    assert clear.read_text() == "5", "VmHWM reset by writing 5 to clear_refs"
    _status(status, rss_kb=1200, hwm_kb=4000)  # after the reset the kernel's peak starts from 1000 kB
    assert meter.peak_bytes == 3000 * 1024
    meter.stop()
    _status(status, rss_kb=1200, hwm_kb=8000)  # after stop the peak is frozen
    entry = meter.report(cache_bytes=1024 * 1024, planned_bytes=1024 * 1024)
    assert entry["peak_bytes"] == 3000 * 1024 and entry["above_cache_bytes"] == (3000 - 1024) * 1024
    assert entry["planned_cache_bytes"] == 1024 * 1024 and entry["why_not"] is None
    line = peak_memory.peak_text(entry)
    assert "2.93 MiB above its start" in line and "the cache's peak 1.00 MiB, planned 1.00 MiB" in line


def test_a_peak_that_cannot_be_reset_is_not_measured_and_says_why(tmp_path):
    status = tmp_path / "status"
    _status(status, rss_kb=1000, hwm_kb=1000)
    meter = peak_memory.PeakMeter("cpu", status=status, clear_refs=tmp_path).start()  # a folder: the write fails
    entry = meter.report(cache_bytes=2048, planned_bytes=None)
    assert entry["peak_bytes"] is None and "cannot be reset" in entry["why_not"]
    assert "not measured" in peak_memory.peak_text(entry)
    assert peak_memory.peak_text(None) is None


def test_an_unknown_device_is_not_measured():
    entry = peak_memory.PeakMeter("meta").start().report(cache_bytes=0, planned_bytes=0)
    assert entry["peak_bytes"] is None and "meta" in entry["why_not"]


@pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="the process's resident peak is read from Linux's /proc"
)
def test_the_real_resident_peak_sees_a_tensor_allocated_and_freed_during_the_run():
    meter = peak_memory.PeakMeter("cpu").start()
    if meter.why_not:
        pytest.skip(meter.why_not)  # a kernel that refuses clear_refs (never seen on Linux 4.0+)
    # 96 MiB of fresh pages, written, then unmapped: an anonymous map of our own, so that no allocator can serve it
    # from memory it already held resident (in a long test process torch's / glibc's free lists can hold that much,
    # and a tensor of 96 MiB then adds nothing to the resident set: seen in CI after 2,000 tests)
    size, page = 96 * 2**20, mmap.PAGESIZE
    big = mmap.mmap(-1, size)
    for at in range(0, size, page):
        big[at] = 1
    big.close()
    meter.stop()
    assert meter.peak_bytes >= 90 * 2**20, meter.peak_bytes
