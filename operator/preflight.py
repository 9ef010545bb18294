"""What `kubeinfer operator` checks before kopf starts. Every finding is one log line, never a traceback.

- No usable cluster configuration (not in a pod, no or a broken kubeconfig): `ClusterUnusable`, which
  the command prints as one line before exiting 2.
- API server unreachable: one WARNING line naming the server and why, then a quiet retry every
  `retry_s` seconds, and one INFO line when it answers. (Without this, kopf's startup handler failed
  with a traceback every 60 s.)
- Credentials refused (401): `ClusterUnusable`.
- The InferenceService CRD not served: one WARNING line; kopf starts watching once the CRD appears.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable

import urllib3
import yaml
from kubernetes.client import ApiException, Configuration
from kubernetes.config import ConfigException

from kubeinfer.operator import kube as kube_mod
from kubeinfer.operator.spec import GROUP, PLURAL, VERSION

log = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 5.0


class ClusterUnusable(Exception):
    """Nothing to retry: a person must fix the configuration."""


def load_configuration() -> Configuration:
    try:
        return kube_mod.load_configuration()
    except (ConfigException, OSError, yaml.YAMLError, ValueError, KeyError) as error:
        raise ClusterUnusable(
            f"no usable Kubernetes configuration: {error} (in a pod the operator uses its service account; "
            f"elsewhere KUBECONFIG or ~/.kube/config)") from None


def unreachable_reason(error: BaseException) -> str:
    """`[Errno 111] Connection refused` out of urllib3's nested exception text."""
    text = str(getattr(error, "reason", None) or error)
    found = re.search(r"\[Errno -?\d+\] [^'\")]+|certificate verify failed[^'\")]*|timed out", text)
    return found.group(0).strip() if found else text.splitlines()[0][:200]


def probe(kube: kube_mod.Kube, host: str) -> tuple[str | None, bool]:
    """(why the API server cannot be used, or None; whether our CRD is served). Raises ClusterUnusable."""
    try:
        kube.request("GET", f"/apis/{GROUP}/{VERSION}", timeout=PROBE_TIMEOUT_S)
        return None, True
    except ApiException as error:
        if error.status == 404:
            return None, False
        if error.status == 401:
            raise ClusterUnusable(f"the API server at {host} refused the credentials (401 Unauthorized)") from None
        if error.status == 403:
            return None, True   # may not read discovery; the watches will say more
        return f"HTTP {error.status} {error.reason}", False
    except (urllib3.exceptions.HTTPError, OSError) as error:
        return unreachable_reason(error), False


def wait_for_api(kube: kube_mod.Kube, host: str, retry_s: float = 10.0,
                 sleep: Callable[[float], None] = time.sleep) -> None:
    started, warned = time.monotonic(), False
    while True:
        reason, crd_served = probe(kube, host)
        if reason is None:
            break
        if not warned:
            log.warning("cannot reach the Kubernetes API server at %s (%s); retrying every %g s", host, reason, retry_s)
            warned = True
        else:
            log.debug("API server at %s still unreachable: %s", host, reason)
        sleep(retry_s)
    if warned:
        log.info("reached the API server at %s after %.0f s", host, time.monotonic() - started)
    if not crd_served:
        log.warning("the InferenceService CRD (%s.%s) is not installed: nothing to act on until it is "
                    "(kubectl apply --server-side -f crds/, or the Helm chart)", PLURAL, GROUP)
