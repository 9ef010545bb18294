"""Compile cache folders named by the environment are created, and one that cannot be written is replaced by a
folder of the pod's own with a warning (a cache is an optimisation: a node directory the runtime's user cannot
write must not stop the server at its first kernel)."""
import logging
import shutil
import subprocess
import sys

import pytest

from kubeinfer.runtime.compile_cache import ensure_writable_caches


def test_named_cache_folders_are_created_and_kept(tmp_path):
    env = {"TRITON_CACHE_DIR": str(tmp_path / "cache" / "triton"), "PATH": "/usr/bin"}
    assert ensure_writable_caches(env) == {}
    assert env["TRITON_CACHE_DIR"] == str(tmp_path / "cache" / "triton")
    assert (tmp_path / "cache" / "triton").is_dir()
    assert list((tmp_path / "cache" / "triton").iterdir()) == []   # the write test leaves nothing behind


def test_an_unwritable_cache_is_replaced_with_one_warning(tmp_path, caplog, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    (tmp_path / "a-file").write_text("")
    env = {"TRITON_CACHE_DIR": str(tmp_path / "a-file" / "triton"),   # under a file: no user can create it
           "CUDA_CACHE_PATH": str(tmp_path / "cuda")}
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", None)   # read TMPDIR again
    with caplog.at_level(logging.WARNING):
        replaced = ensure_writable_caches(env)
    fallback = str(tmp_path / "tmp" / "kubeinfer-cache" / "triton_cache_dir")
    assert replaced == {"TRITON_CACHE_DIR": fallback} and env["TRITON_CACHE_DIR"] == fallback
    assert env["CUDA_CACHE_PATH"] == str(tmp_path / "cuda")
    [record] = caplog.records
    assert "TRITON_CACHE_DIR" in record.message and "cannot be written" in record.message and fallback in record.message


def test_a_cpu_engine_has_its_native_kernels_before_the_first_request(llama_dir):
    """gcc builds the native CPU kernels at their first call (several seconds on a cold cache, as in a new pod):
    the engine's start-up warm-up makes that call, so every kernel a forward uses is loaded before any request.
    A fresh process: the kernels this one loaded would hide it."""
    if not (shutil.which("cc") or shutil.which("gcc")):
        pytest.skip("no C compiler: the CPU runs the PyTorch reference kernels")
    code = ("from kubeinfer.runtime.llm import LLM\nfrom kubeinfer.kernels import cpu_native\n"
            f"LLM({str(llama_dir)!r}, num_kvcache_blocks=8)\n"
            "print(sorted(name for name, lib in cpu_native._loaded.items() if lib is not None))")
    done = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    loaded = done.stdout.strip().splitlines()[-1]
    for kernel in ("paged_attention_cpu", "elementwise_cpu", "linear_cpu"):
        assert repr(kernel) in loaded, (kernel, loaded)
