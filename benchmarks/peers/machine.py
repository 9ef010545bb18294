"""The machine a benchmark ran on, in one line: figures from different CPUs must never be read side by side."""
import os
import platform
from pathlib import Path

FLAGS_OF_NOTE = ("avx2", "fma", "avx512f", "avx512_bf16", "amx_tile")


def describe() -> str:
    """E.g. `AMD EPYC (x86_64), 2 CPUs; avx2 fma; no avx512f avx512_bf16 amx_tile`."""
    model, flags = platform.processor() or platform.machine(), set()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                model = f"{value.strip()} ({platform.machine()})"
            elif key.strip() == "flags":
                flags = set(value.split())
                break
    has = [flag for flag in FLAGS_OF_NOTE if flag in flags]
    missing = [flag for flag in FLAGS_OF_NOTE if flag not in flags]
    return f"{model}, {os.cpu_count()} CPUs; {' '.join(has) or '-'}" + (f"; no {' '.join(missing)}" if missing else "")
