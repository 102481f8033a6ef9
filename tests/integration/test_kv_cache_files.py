"""Cache files from strangers, in-process: the Load KV Cache listing and Save KV Cache's path.

The listing runs on ComfyUI's event loop for every ``/object_info`` and ``/prompt``: it must never open a
FIFO or a device, never list a symlink that leads out of the folder, read at most a capped part of a
header, and read a file's header only once until the file changes. Save KV Cache must never write
through a symlink out of output/, and refuses prefixes that are only dots. Every file is built here;
``test_server_hostile_files.py`` shows the same against a live server.
"""

from __future__ import annotations

import importlib
import json
import os
import stat
import struct

import pytest
import torch
from safetensors.torch import save_file

FORMAT = "jensen_kv_run_state"


@pytest.fixture
def lk(pack):
    return importlib.import_module("comfyui_jensen_kv.nodes.load_kv_cache")


@pytest.fixture
def folders(tmp_path, monkeypatch, lk):
    """ComfyUI's output and input folders in tmp_path (and a folder next to them, outside both), listing cache
    emptied."""
    import folder_paths

    out, inp, outside = tmp_path / "output", tmp_path / "input", tmp_path / "outside"
    for d in (out, inp, outside):
        d.mkdir()
    monkeypatch.setattr(folder_paths, "output_directory", str(out))
    monkeypatch.setattr(folder_paths, "input_directory", str(inp))
    monkeypatch.setattr(lk, "_LISTING_CACHE", {}, raising=False)
    return out, inp, outside


def cache_file(path, fmt=FORMAT, **meta) -> str:
    """A safetensors file whose metadata says it is a Jensen KV cache (the listing reads nothing else)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    save_file({"x": torch.zeros(2)}, str(path), metadata={"format": fmt, "version": "1", **meta})
    return str(path)


def raw_safetensors(path, header: bytes, claimed: int | None = None, data: bytes = b"") -> None:
    """A file laid out as safetensors: 8-byte little-endian header length (``claimed`` or the real one), header,
    data."""
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header) if claimed is None else claimed) + header + data)


def in_child(fn, timeout=60.0):
    """``fn()`` in a forked child process, its result returned; fails (instead of hanging the suite) when the
    child does not finish in ``timeout`` s. A child, not a thread: a reader stuck opening a FIFO may hold the GIL
    (safetensors' safe_open does), which would stop every thread of this process, as it froze the server."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    recv, send = ctx.Pipe(duplex=False)

    def child():
        try:
            send.send(("ok", fn()))
        except BaseException as exc:  # noqa: BLE001 - reported to the parent
            send.send(("error", f"{type(exc).__name__}: {exc}"))

    proc = ctx.Process(target=child, daemon=True)
    proc.start()
    try:
        if not recv.poll(timeout):
            pytest.fail(f"blocked for {timeout:.0f} s (a FIFO opened?)")
        status, value = recv.recv()
    finally:
        proc.kill()
        proc.join(10)
    assert status == "ok", value
    return value


def hostile_folder(out, inp, outside) -> list[str]:
    """Output and input folders holding what a stranger (or a careless link) can put there; returns the names
    that must be listed."""
    cache_file(out / "jensen_kv" / "good_00001_.safetensors")
    cache_file(inp / "shared.safetensors")
    os.symlink(out / "jensen_kv" / "good_00001_.safetensors", out / "alias.safetensors")  # inside: listed
    fifos = [str(out / "x.safetensors"), str(inp / "jensen_kv_fifo.safetensors")]
    for fifo in fifos:
        os.mkfifo(fifo)
    os.symlink(fifos[0], out / "link_to_fifo.safetensors")
    cache_file(outside / "secret.safetensors")
    os.symlink(outside / "secret.safetensors", out / "outside.safetensors")  # a cache file, but outside
    os.symlink(outside, out / "linked_dir")  # a folder symlink leading out: not entered
    os.symlink(outside / "missing.safetensors", inp / "dangling.safetensors")
    os.symlink("/dev/zero", out / "zero.safetensors")  # a device, outside
    if os.geteuid() == 0:  # a device node inside the folder (mknod needs root)
        os.mknod(out / "null.safetensors", stat.S_IFCHR | 0o600, os.makedev(1, 3))
    os.mkdir(out / "dir.safetensors")
    cache_file(out / "not_this.safetensors", fmt="something_else")
    return ["input/shared", "output/alias", "output/jensen_kv/good_00001_"]  # listed without the extension


# ----------------------------------------------------------------------------- item 3: the listing
def test_listing_skips_fifos_devices_and_symlinks_out_of_the_folder_without_blocking(lk, folders):
    out, inp, outside = folders
    expected = hostile_folder(out, inp, outside)
    assert in_child(lambda: (lk.list_cache_files(), lk.list_cache_files())) == (expected, expected)  # 2nd: cached


def test_listing_opens_only_regular_files_inside_the_folder(lk, folders, monkeypatch):
    """The mechanism: the header reader is handed only the real paths of regular files inside the folders, so a
    FIFO or device is never opened at all (opening a FIFO for reading blocks until a writer comes)."""
    out, inp, outside = folders
    hostile_folder(out, inp, outside)
    opened = []
    real = lk._header_format
    monkeypatch.setattr(lk, "_header_format", lambda p: opened.append(p) or real(p))
    opened = in_child(lambda: (lk.list_cache_files(), opened)[1])
    assert sorted(opened) == sorted(
        str(p)
        for p in (
            out / "jensen_kv" / "good_00001_.safetensors",
            inp / "shared.safetensors",
            out / "not_this.safetensors",
        )
    )
    for p in opened:
        assert stat.S_ISREG(os.lstat(p).st_mode)


def test_the_header_reader_refuses_what_is_not_a_regular_file(lk, folders, monkeypatch):
    """Even when a FIFO is swapped in after the listing's stat, the reader opens it non-blocking and reads
    nothing."""
    out, _, _ = folders
    fifo = str(out / "swapped.safetensors")
    os.mkfifo(fifo)
    reads = []
    real_read = lk._read_upto
    monkeypatch.setattr(lk, "_read_upto", lambda fd, n: reads.append(n) or real_read(fd, n))
    assert in_child(lambda: (lk._header_format(fifo), reads)) == (None, [])
    assert lk._header_format("/dev/zero") is None
    assert reads == []  # not a byte read from the FIFO or the device: refused on its fstat


def test_each_header_is_read_once_until_the_file_changes(lk, folders, monkeypatch):
    out, inp, _ = folders
    for i in range(3):
        cache_file(out / f"kv_{i}.safetensors")
    for i in range(200):  # many files that are no cache: read once, then answered from the cache
        save_file({"w": torch.zeros(1)}, str(inp / f"lora_{i:03}.safetensors"))
    reads = []
    real = lk._header_format
    monkeypatch.setattr(lk, "_header_format", lambda p: reads.append(p) or real(p))
    names = lk.list_cache_files()
    assert names == [f"output/kv_{i}" for i in range(3)] and len(reads) == 203
    reads.clear()
    assert lk.list_cache_files() == names and reads == []
    # a changed file (mtime or size) is read again, and only that one
    st = os.stat(out / "kv_1.safetensors")
    os.utime(out / "kv_1.safetensors", ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert lk.list_cache_files() == names and reads == [str(out / "kv_1.safetensors")]
    # replaced by a file that is no cache (same name): re-read and dropped
    reads.clear()
    save_file({"w": torch.zeros(3)}, str(out / "kv_2.safetensors"))
    assert lk.list_cache_files() == names[:2] and reads == [str(out / "kv_2.safetensors")]
    # deleted files leave the cache
    os.remove(out / "kv_0.safetensors")
    assert lk.list_cache_files() == names[1:2]
    assert str(out / "kv_0.safetensors") not in lk._LISTING_CACHE


def test_the_listing_reads_a_header_only_up_to_its_cap(lk, folders, monkeypatch):
    out, _, _ = folders
    cap = lk.LISTING_HEADER_BYTES
    # a valid safetensors file, its metadata first, but a header longer than any cache file's: not read
    blob = json.dumps({"__metadata__": {"format": FORMAT, "pad": "a" * cap}}).encode()
    raw_safetensors(out / "huge_header.safetensors", blob + b" " * (-len(blob) % 8))
    # a header length far beyond the file, and one of 200 MB (present: a sparse file, no disk used)
    raw_safetensors(out / "liar.safetensors", b'{"__metadata__":{"format":"' + FORMAT.encode() + b'"}}', 2**40)
    with open(out / "sparse.safetensors", "wb") as f:
        f.write(struct.pack("<Q", 200_000_000) + b'{"__metadata__":{"format":"' + FORMAT.encode() + b'"}}')
        f.truncate(8 + 200_000_000)
    # a long state (1 MiB of metadata, format last): read as far as the metadata's end, listed
    blob = json.dumps({"__metadata__": {"state": "s" * (1 << 20), "format": FORMAT}}).encode()
    raw_safetensors(out / "long_state.safetensors", blob + b" " * (-len(blob) % 8))
    # metadata that never closes within the header: malformed, not listed
    raw_safetensors(
        out / "unclosed.safetensors", b'{"__metadata__":{"format":"' + FORMAT.encode() + b'"' + b" " * 70000
    )
    cache_file(out / "fine.safetensors")
    read = []
    real_read = lk._read_upto
    monkeypatch.setattr(lk, "_read_upto", lambda fd, n: read.append(n) or real_read(fd, n))
    assert lk.list_cache_files() == ["output/fine", "output/long_state"]
    assert sum(read) <= 6 * 8 + 3 * (64 << 10) + (1 << 20) + 70000, read  # nothing of the three liars' headers


def test_a_cache_file_is_known_by_its_metadata_alone(lk, folders, monkeypatch):
    """A real cache file's header holds an entry per tensor after the metadata (MiBs for a long run): the listing
    reads the first 64 KiB of it, whatever order safetensors wrote the metadata's keys in."""
    out, _, _ = folders
    state = json.dumps({"retained": [{"chunk": i, "shape": [1, 16, 3, 60, 104]} for i in range(200)]})
    tensors = {f"cache.{i}.{'k' * 1500}": torch.zeros(1, dtype=torch.uint8) for i in range(3000)}
    save_file(
        tensors,
        str(out / "long_00001_.safetensors"),
        metadata={"format": FORMAT, "version": "1", "state": state, "sha256": "0" * 64},
    )
    header_len = struct.unpack("<Q", (out / "long_00001_.safetensors").read_bytes()[:8])[0]
    assert header_len > 4 << 20
    read = []
    real_read = lk._read_upto
    monkeypatch.setattr(lk, "_read_upto", lambda fd, n: read.append(n) or real_read(fd, n))
    assert lk.list_cache_files() == ["output/long_00001_"]
    assert read == [8, 64 << 10]


def test_a_listed_name_is_no_model_file_name_and_both_forms_resolve(lk, folders):
    """Issue 41: the front end takes a combo value ending in .safetensors for a model and lists a missing one under
    "Missing Models" in folder "Unknown"; the list drops the extension, and a workflow saved with it (before) still
    resolves to the same file. A name with the extension whose listed form is another file is that other file."""
    out, _, _ = folders
    path = cache_file(out / "jensen_kv" / "story_00001_.safetensors")
    (listed,) = lk.list_cache_files()
    assert listed == "output/jensen_kv/story_00001_" and not listed.endswith((".safetensors", ".sft", ".pt"))
    assert lk.resolve(listed) == lk.resolve(listed + ".safetensors") == os.path.realpath(path)
    twice = cache_file(out / "a.safetensors.safetensors")
    cache_file(out / "a.safetensors")
    assert lk.resolve("output/a.safetensors") == os.path.realpath(twice)  # the listed name of a.safetensors.safetensors
    assert lk.resolve("output/a") == os.path.realpath(out / "a.safetensors")
    with pytest.raises(ValueError, match="does not exist"):
        lk.resolve("output/jensen_kv/story_00002_")


# ----------------------------------------------------------------------------- item 7: Save KV Cache's path
@pytest.fixture
def state(pack):
    rs = importlib.import_module("comfyui_jensen_kv.runtime.saved_run")
    return rs.SavedRun(
        fingerprint={"family": "wan2.1", "layers": 1, "heads": 1, "head_dim": 8},
        spec_k=None,
        spec_v=None,
        chunk_frames=1,
        window_chunks=0,
        sink_chunks=0,
        latent_shape=(1, 16, 2, 2),
        next_chunk=0,
        next_frame=0,
        branches=[0],
        active_prompt="",
        caches={},
    )


def all_files(folder) -> list[str]:
    return sorted(os.path.relpath(os.path.join(d, f), folder) for d, _, fs in os.walk(folder) for f in fs)


def test_save_writes_inside_output_and_through_a_symlink_that_stays_inside(nodes, folders, state):
    out, _, _ = folders
    nodes.JensenKVSaveKVCache.execute(state, "jensen_kv/kv_cache")
    (out / "real_dir").mkdir()
    os.symlink(out / "real_dir", out / "alias_dir")
    nodes.JensenKVSaveKVCache.execute(state, "alias_dir/kv")
    assert all_files(out) == ["jensen_kv/kv_cache_00001_.safetensors", "real_dir/kv_00001_.safetensors"]


@pytest.mark.parametrize("prefix", ["escape/kv", "escape/new/deeper/kv", "ok/../escape/kv", "escape/%year%/kv"])
def test_save_refuses_a_directory_symlink_that_leads_out_of_output(nodes, folders, state, prefix):
    out, _, outside = folders
    os.symlink(outside, out / "escape")
    with pytest.raises(ValueError, match="outside ComfyUI's output folder") as e:
        nodes.JensenKVSaveKVCache.execute(state, prefix)
    assert "symlink" in str(e.value)
    assert os.listdir(outside) == [] and all_files(out) == []  # nothing written, no folder made outside


@pytest.mark.parametrize("prefix", ["", ".", "..", "...", " . ", "jensen_kv/..", "/", "jensen_kv/../.."])
def test_save_refuses_dot_only_prefixes(nodes, folders, state, prefix):
    out, _, _ = folders
    message = nodes.JensenKVSaveKVCache.validate_inputs(filename_prefix=prefix)
    assert isinstance(message, str) and "filename_prefix" in message
    with pytest.raises(ValueError, match="filename_prefix"):
        nodes.JensenKVSaveKVCache.execute(state, prefix)
    assert all_files(out) == []  # no hidden ._00001_ file


def test_save_accepts_ordinary_prefixes(nodes, folders, state):
    out, _, _ = folders
    for prefix in ("kv", "a/../b", "jensen_kv/run.1", ".hidden_dir/kv", "%year%/kv"):
        assert nodes.JensenKVSaveKVCache.validate_inputs(filename_prefix=prefix) is True, prefix
    assert nodes.JensenKVSaveKVCache.validate_inputs(filename_prefix=None) is True  # linked: checked when it runs
    nodes.JensenKVSaveKVCache.execute(state, "a/../b")
    assert all_files(out) == ["b_00001_.safetensors"]
