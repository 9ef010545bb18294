"""glibc's malloc, told to keep the memory a CPU engine frees and allocates again at every step.

By default glibc gives large freed buffers back to the kernel (munmap, or a trim of the heap) and raises
its mmap threshold only as it goes; every step's activations are then fresh pages, each faulted in and zeroed
by the kernel. Measured on benchmarks/throughput.py (2-core box): ~200,000 minor page faults per pass and
up to 1 s of a 7 s run; with the settings below ~15,000 faults and that second gone (docs/benchmarks/cpu-runtime.md).

The settings: a fixed mmap threshold at glibc's maximum (32 MiB: buffers below it come from the heap, which
is reused) and no trimming of the heap's top. The cost is that memory freed by the engine stays with the
process, which a server with a fixed memory budget wants anyway. No-op where the C library is not glibc.
"""
import ctypes
import ctypes.util
import logging

logger = logging.getLogger(__name__)
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3   # glibc's mallopt parameters (malloc.h)
MMAP_THRESHOLD_BYTES = 32 * 2**20             # DEFAULT_MMAP_THRESHOLD_MAX on 64-bit glibc
TRIM_THRESHOLD_BYTES = 2**31 - 1              # the largest mallopt takes (an int): in effect, never trim


def keep_freed_memory() -> bool:
    """Applies the settings above to this process; True when glibc took them."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    took = mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1 and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES) == 1
    if not took:
        logger.info("malloc settings not applied (not glibc?): CPU steps may page-fault more")
    return took


def release_freed_memory() -> bool:
    """Gives the memory glibc holds free back to the kernel (malloc_trim): what a sleeping engine freed (the
    settings above keep it otherwise). False where the C library is not glibc."""
    try:
        trim = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return False
    trim.argtypes = [ctypes.c_size_t]
    trim(0)
    return True
