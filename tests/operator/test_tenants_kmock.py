"""`spec.tenants` against kmock: the replicas' and the router's Deployments mount the tenants' Secret, the replicas
run the fair queue and the router caps each tenant; a spec the schema would refuse (here it is not checked) is an
InvalidSpec condition with the same message, and builds nothing."""

from __future__ import annotations

from typing import Any

import pytest

from kubeinfer.operator.reconcile import pod

from support.manifests import condition, isvc_manifest
from support.operator_harness import NAMESPACE, child_path, isvc_path, settle

NAME = "teams"
SECRET_VOLUME = {"name": "api-keys", "secret": {"secretName": "tenant-keys", "defaultMode": 0o440,
                                                "items": [{"key": "lines", "path": "keys"}]}}
KEYS_MOUNT = {"name": "api-keys", "mountPath": pod.API_KEYS_DIR, "readOnly": True}


def manifest(**spec: Any) -> dict[str, Any]:
    return isvc_manifest(NAME, NAMESPACE, "uid-teams", **spec)


def flags(container: dict[str, Any]) -> dict[str, str]:
    args = container["args"]
    return {arg: args[i + 1] for i, arg in enumerate(args[:-1]) if arg.startswith("--")}


async def test_tenants_mount_the_secret_in_replicas_and_router_with_the_fair_queue_and_the_cap(
        operator: Any, kapi: Any) -> None:
    tenants = {"secretRef": {"name": "tenant-keys", "key": "lines"}, "maxInFlightPerTenant": 6}
    await kapi.create(isvc_path(NAMESPACE), manifest(tenants=tenants, router={}))
    replicas = await kapi.eventually(child_path("Deployment", NAMESPACE, NAME), lambda d: True)
    routers = await kapi.eventually(child_path("Deployment", NAMESPACE, f"{NAME}-router"), lambda d: True)
    for dep in (replicas, routers):
        template = dep["spec"]["template"]["spec"]
        assert SECRET_VOLUME in template["volumes"]
        container = template["containers"][0]
        assert KEYS_MOUNT in container["volumeMounts"]
        assert flags(container)["--api-keys-file"] == pod.API_KEYS_FILE
    runtime_flags = flags(replicas["spec"]["template"]["spec"]["containers"][0])
    router_flags = flags(routers["spec"]["template"]["spec"]["containers"][0])
    assert runtime_flags["--scheduling-policy"] == "fair" and "--max-in-flight-per-tenant" not in runtime_flags
    assert router_flags["--max-in-flight-per-tenant"] == "6"
    # isolated prefix caches are the runtime's and the router's default: no flag, no roll of existing pods
    assert "--prefix-cache-sharing" not in runtime_flags and "--prefix-cache-sharing" not in router_flags


async def test_shared_prefix_caches_and_the_trusted_header_reach_the_replicas_and_the_router(operator: Any, kapi: Any) -> None:
    tenants = {"secretRef": {"name": "tenant-keys", "key": "lines"}, "prefixCacheSharing": "shared",
               "trustedTenantHeader": "X-Tenant"}
    await kapi.create(isvc_path(NAMESPACE), manifest(tenants=tenants, router={}))
    for name in (NAME, f"{NAME}-router"):
        dep = await kapi.eventually(child_path("Deployment", NAMESPACE, name), lambda d: True)
        given = flags(dep["spec"]["template"]["spec"]["containers"][0])
        assert given["--prefix-cache-sharing"] == "shared" and given["--trusted-tenant-header"] == "X-Tenant"


@pytest.mark.parametrize("spec, message", [
    ({"tenants": {"secretRef": {"name": "t"}}, "apiKeySecretRef": {"name": "k"}},
     "tenants.secretRef and apiKeySecretRef both name the API keys' Secret: give one"),
    ({"tenants": {"secretRef": {"name": "t"}, "maxInFlightPerTenant": 2}},
     "tenants.maxInFlightPerTenant is enforced by the router: add spec.router"),
])
async def test_a_tenants_spec_the_schema_refuses_is_an_invalid_spec_condition(
        operator: Any, kapi: Any, spec: dict[str, Any], message: str) -> None:
    await kapi.create(isvc_path(NAMESPACE), manifest(**spec))
    obj = await kapi.eventually(isvc_path(NAMESPACE, NAME), lambda o: condition(o, "Degraded").get("status") == "True")
    assert condition(obj, "Degraded")["reason"] == "InvalidSpec"
    assert message in condition(obj, "Degraded")["message"]
    await settle(operator)
    assert await kapi.get(child_path("Deployment", NAMESPACE, NAME)) is None
