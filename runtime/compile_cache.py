"""The compile caches the runtime's compilers write to (Triton's kernels; torch's and CUDA's): each variable
that names one must name a folder this process can write, or the compiler fails at the first kernel, inside
start-up or a request. A cache is worth having, not worth dying for: one that cannot be written is replaced
by a folder under the temporary directory, with one warning that says why (the operator mounts a node
directory there when asked; a node directory the pod's user cannot write is the usual cause)."""
import logging
import os
import tempfile
from collections.abc import MutableMapping

logger = logging.getLogger(__name__)
CACHE_VARIABLES = ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "CUDA_CACHE_PATH")


def ensure_writable_caches(env: MutableMapping[str, str] = os.environ) -> dict[str, str]:
    """Creates each cache folder named in `env`; replaces the ones that cannot be written. Returns the
    replacements ({variable: new folder}). Call before starting processes that compile (they inherit `env`)."""
    replaced = {}
    for name in CACHE_VARIABLES:
        folder = env.get(name)
        if not folder:
            continue
        try:
            os.makedirs(folder, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=folder, prefix=".kubeinfer-write-test-"):
                pass
        except OSError as error:
            fallback = os.path.join(tempfile.gettempdir(), "kubeinfer-cache", name.lower())
            os.makedirs(fallback, exist_ok=True)
            logger.warning("%s=%s cannot be written (%s); compiling into %s instead, which this pod alone keeps: "
                           "give the cache volume to the runtime's user (uid %d)", name, folder,
                           error.strerror or error, fallback, os.getuid())
            env[name] = replaced[name] = fallback
    return replaced
