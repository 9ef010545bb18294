"""Native CPU kernels: C sources in `kernels/csrc`, compiled with the machine's C compiler at first use.

The library is built for the CPU it runs on (`-march=native`), with OpenMP: it shares torch's thread pool (torch
loads its libgomp first, and ours resolves to the same one), so `torch.set_num_threads` sets its threads too.
It is plain C called through ctypes, without torch's headers: a build takes about a second, and is cached in
`KUBEINFER_KERNEL_CACHE_DIR` (default `$XDG_CACHE_HOME/kubeinfer/kernels`) under a key of the source, the
flags, the compiler and the CPU, so a cache shared by nodes of different CPUs never loads a wrong build.

Without a compiler (or when a build fails) `library()` returns None, says why once, and the ops take their
PyTorch references: slower, never wrong.
"""
import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

logger = logging.getLogger(__name__)
SOURCES = Path(__file__).parent / "csrc"
COMPILE_FLAGS = ("-O3", "-mprefer-vector-width=512", "-ffast-math", "-fopenmp", "-fPIC")
# The instruction set built for: this CPU's own by default; KUBEINFER_KERNEL_MARCH=x86-64-v3 (AVX2), say, builds
# and tests the paths a CPU without AVX-512 takes.
MARCH_ENV = "KUBEINFER_KERNEL_MARCH"


def compile_flags() -> tuple[str, ...]:
    return (f"-march={os.environ.get(MARCH_ENV) or 'native'}", *COMPILE_FLAGS)
# Linked WITHOUT -ffast-math: with it gcc links crtfastmath.o, whose constructor turns on flush-to-zero and
# denormals-are-zero for the whole process when the library loads (every thread's floats, not only ours).
LINK_FLAGS = ("-shared", "-fopenmp")
_lock = threading.Lock()
_loaded: dict[str, ctypes.CDLL | None] = {}


def cache_dir() -> Path:
    folder = os.environ.get("KUBEINFER_KERNEL_CACHE_DIR")
    if folder:
        return Path(folder)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "kubeinfer" / "kernels"


def _compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


def _cpu_identity() -> str:
    """What `-march=native` depends on: the CPU's model and feature flags."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return os.uname().machine
    wanted = ("model name", "flags")
    return "\n".join(dict.fromkeys(line for line in lines if line.split(":")[0].strip() in wanted))


def _build(name: str, compiler: str, sources: Path = SOURCES) -> Path:
    source = sources / f"{name}.c"
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True).stdout.split("\n")[0]
    flags = " ".join(compile_flags() + LINK_FLAGS)
    # The source and every file it may include (headers, and another source with other settings).
    texts = [path.read_text() for path in [source, *sorted(sources.glob("*.h")), *sorted(sources.glob("*.c"))]]
    key = hashlib.sha256("\0".join([*texts, flags, version, _cpu_identity()]).encode())
    folder = cache_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        fallback = Path(tempfile.gettempdir()) / "kubeinfer-kernels"
        logger.warning("cannot use %s for compiled kernels (%s); using %s", folder, error.strerror or error, fallback)
        folder = fallback
        folder.mkdir(parents=True, exist_ok=True)
    target = folder / f"{name}-{key.hexdigest()[:16]}.so"
    if target.exists():
        return target
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:   # built aside, then renamed: atomic
        built, objects = Path(tmp) / target.name, Path(tmp) / f"{name}.o"
        for command in ([compiler, *compile_flags(), "-c", "-o", str(objects), str(source)],
                        [compiler, *LINK_FLAGS, "-o", str(built), str(objects), "-lm"]):
            result = subprocess.run(command, capture_output=True, text=True)
            if result.returncode != 0:
                raise RuntimeError(f"{compiler} failed on {source.name}: {result.stderr.strip()[-2000:]}")
        os.replace(built, target)
    logger.info("built the native CPU kernel %s into %s", name, target)
    return target


def library(name: str) -> ctypes.CDLL | None:
    """The compiled library of `csrc/NAME.c`, built on first use; None when it cannot be built here."""
    with _lock:
        if name in _loaded:
            return _loaded[name]
        import torch   # noqa: F401  (torch's libgomp first: the library then shares its OpenMP pool)
        compiler = _compiler()
        lib = None
        if compiler is None:
            logger.warning("no C compiler (cc, gcc or $CC): the CPU runs the PyTorch reference kernels, several "
                           "times slower (install gcc)")
        else:
            try:
                lib = ctypes.CDLL(str(_build(name, compiler)))
            except (OSError, RuntimeError, subprocess.SubprocessError) as error:
                logger.warning("could not build the native CPU kernel %s (%s): the CPU runs the PyTorch reference "
                               "kernels instead", name, error)
        _loaded[name] = lib
        return lib


def library_from(name: str, sources: Path) -> ctypes.CDLL:
    """`NAME.c` of another source folder (another version's `kernels/csrc`, to compare against), built and cached as
    `library` builds its own, loaded beside it; raises where it cannot be built."""
    import torch   # noqa: F401  (torch's libgomp first, as in `library`)
    compiler = _compiler()
    if compiler is None:
        raise RuntimeError("no C compiler (cc, gcc or $CC)")
    return ctypes.CDLL(str(_build(name, compiler, sources)))
