"""The one I/O step that makes a child object match its desired form.

Rules, in order:
1. Read the live object. If its hash annotation equals the desired one and every field we set
   still holds the value we set (hand edits show up here), write nothing.
2. Otherwise server-side apply the whole desired object (field manager ``kubeinfer-operator``,
   force: the operator owns these fields). Removed spec fields change the hash, so they are
   re-applied and SSA drops what the manager no longer sets.
3. A 404 on apply means the server did not create on apply (an emulator without SSA): create.
   A 409 on that create means someone created it meanwhile: apply once more.
"""

from __future__ import annotations

import logging
from typing import Any, Literal

from kubernetes.client import ApiException
from kubernetes.utils import parse_quantity

from kubeinfer.operator.kube import Kube, object_path, resource_path
from kubeinfer.operator.reconcile.builders import HASH_ANNOTATION, Owner

log = logging.getLogger(__name__)

Outcome = Literal["unchanged", "created", "updated"]


def _same_scalar(want: Any, have: Any) -> bool:
    if want == have:
        return True
    # The API server canonicalises quantities ("1000m" -> "1"), and int-or-string fields may come back as
    # either; compare them by value.
    if isinstance(want, (str, int)) and isinstance(have, (str, int)) and not isinstance(want, bool):
        try:
            return parse_quantity(want) == parse_quantity(have)
        except (ValueError, TypeError):
            return False
    return False


def is_subset(want: Any, have: Any) -> bool:
    """Whether every field in ``want`` is present in ``have`` with the same value.

    Extra fields in ``have`` (server defaults, other managers) are fine. Lists must match item by item.
    """
    if isinstance(want, dict):
        return isinstance(have, dict) and all(k in have and is_subset(v, have[k]) for k, v in want.items())
    if isinstance(want, list):
        return isinstance(have, list) and len(want) == len(have) and all(map(is_subset, want, have))
    return _same_scalar(want, have)


def in_sync(desired: dict[str, Any], live: dict[str, Any] | None) -> bool:
    if live is None:
        return False
    want_hash = desired["metadata"]["annotations"][HASH_ANNOTATION]
    have_hash = (live.get("metadata", {}).get("annotations") or {}).get(HASH_ANNOTATION)
    return want_hash == have_hash and is_subset(desired, live)


def ensure(kube: Kube, desired: dict[str, Any], seen: dict[str, dict[str, Any]] | None = None) -> Outcome:
    """Make the live object match ``desired``; returns what was done. ``seen`` gets the object as the server
    answered it (read, or written), under its path, so that the pass need not read it again."""
    path = object_path(desired)
    live = kube.get(path)
    if in_sync(desired, live):
        if seen is not None:
            seen[path] = live
        return "unchanged"
    what = f"{desired['kind']} {desired['metadata']['namespace']}/{desired['metadata']['name']}"
    try:
        written = kube.apply(desired)
    except ApiException as e:
        if e.status != 404:
            raise
        try:
            written = kube.create(desired)
        except ApiException as e2:
            if e2.status != 409:
                raise
            written = kube.apply(desired)
        log.info("created %s", what)
        if seen is not None:
            seen[path] = written
        return "created"
    if seen is not None:
        seen[path] = written
    outcome: Outcome = "created" if live is None else "updated"
    log.info("%s %s", outcome, what)
    return outcome


def delete_owned(kube: Kube, owner: Owner, api_version: str, kind: str, name: str, why: str) -> bool:
    """Deletes a child that no longer belongs, if it is there and this owner's (a namesake of someone else's is
    left alone); returns whether it deleted it. A 404 meanwhile is the same outcome."""
    path = resource_path(api_version, kind, owner.namespace, name)
    live = kube.get(path)
    if live is None or not any(ref.get("uid") == owner.uid
                               for ref in (live.get("metadata") or {}).get("ownerReferences") or ()):
        return False
    try:
        kube.request("DELETE", path)
    except ApiException as e:
        if e.status != 404:
            raise
        return False
    log.info("deleted %s %s/%s (%s)", kind, owner.namespace, name, why)
    return True
