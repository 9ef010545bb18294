"""Whether this operator copy coordinates with others through a kopf peering object, decided at start.

Policy:
- `--standalone` (KUBEINFER_STANDALONE): no peering, whatever exists.
- A peering name set explicitly (`--peering`, KUBEINFER_PEERING; the Helm chart sets it and creates the
  object): peering is mandatory. kopf then holds every watch until the object exists, so a missing object
  is said at WARNING level, with the fix, instead of kopf's silent (debug-level) pause.
- Neither (a plain `kubeinfer operator`): peering when the default object exists, else standalone. The
  operator acts at once, and says which it chose and what a second copy would need.
The peering object is cluster-wide (ClusterKopfPeering) when all namespaces are watched, else one
KopfPeering per watched namespace (globs cannot be looked up; the literal names are).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable

from kubeinfer.operator.config import DEFAULT_PEERING, OperatorConfig

PEERING_API = "/apis/kopf.dev/v1"


@dataclasses.dataclass(frozen=True)
class PeeringMode:
    standalone: bool
    name: str | None  # kopf's peering_name; None when standalone
    level: int        # of the line that says why
    message: str


def peering_paths(name: str, namespaces: tuple[str, ...]) -> list[str]:
    """The peering objects kopf would use: cluster-wide, or one per literal watched namespace."""
    if not namespaces:
        return [f"{PEERING_API}/clusterkopfpeerings/{name}"]
    return [f"{PEERING_API}/namespaces/{ns}/kopfpeerings/{name}" for ns in namespaces
            if not any(c in ns for c in "*?[")]


def choose(config: OperatorConfig, exists: Callable[[str], bool]) -> PeeringMode:
    """The mode for `config`, looking the peering object up with `exists(path)`."""
    if config.standalone:
        return PeeringMode(True, None, logging.INFO, "standalone (--standalone): no peering with other copies")
    name = config.peering or DEFAULT_PEERING
    paths = peering_paths(name, config.namespaces)
    found = [path for path in paths if exists(path)]
    where = "cluster-wide" if not config.namespaces else f"in namespaces {list(config.namespaces)}"
    if config.peering:
        if found:
            return PeeringMode(False, name, logging.INFO, f"peering {name!r} {where}: the highest-priority copy acts")
        return PeeringMode(False, name, logging.WARNING,
                           f"peering {name!r} was asked for but no peering object exists {where}: this copy "
                           f"waits, acting on nothing, until one is created (kubectl apply -f crds/kopf-peering.yaml "
                           f"and a {'ClusterKopfPeering' if not config.namespaces else 'KopfPeering'} named "
                           f"{name!r}; the Helm chart makes both), or run it with --standalone")
    if found:
        return PeeringMode(False, name, logging.INFO,
                           f"peering {name!r} {where} found: the highest-priority copy acts (--standalone to ignore it)")
    return PeeringMode(True, None, logging.INFO,
                       f"standalone: no peering object {name!r} {where}; a second copy would act too "
                       f"(create one, or set --peering, to run several copies)")
