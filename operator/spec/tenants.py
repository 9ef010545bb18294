"""Who sends the requests: the keys Secret (`spec.apiKeySecretRef`), or `spec.tenants`, the same Secret whose keys
name tenants, with weights and priorities, and the queue policy and caps that share the service between them
(docs/server.md, "Tenants"; docs/operator.md)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from kubeinfer.operator.spec.schema import SpecModel, cel


class SecretKeyRef(SpecModel):
    name: str = Field(max_length=253)
    key: str = Field(default="api-keys", description="Key holding one API key per line.")


class TenantsSpec(SpecModel):
    """Tenants: a keys file whose lines are `KEY [TOKENS_PER_MINUTE] [tenant=NAME] [weight=W] [priority=P]`, mounted
    in the replicas and the router (as apiKeySecretRef's is), and how the service is shared between them."""

    secret_ref: SecretKeyRef = Field(
        description="Secret with the keys file: one `KEY [TOKENS_PER_MINUTE] [tenant=NAME] [weight=W] [priority=P]` "
                    "per line (docs/server.md, Tenants).")
    scheduling_policy: Literal["fair", "fcfs"] = Field(
        default="fair", description="The replicas' waiting queue: fair (strict priority classes, then a weighted "
                                    "fair share of tokens between tenants) or fcfs (arrival order; tenants are "
                                    "only counted).")
    max_in_flight_per_tenant: int | None = Field(
        default=None, ge=1, description="Requests one tenant may hold open at the router (needs spec.router); more "
                                        "get 429. No cap when unset.")
    trusted_tenant_header: str | None = Field(
        default=None, pattern=r"^[A-Za-z0-9-]{1,64}$",
        description="A header naming the tenant, set by a gateway that authenticates users itself: the router and "
                    "the replicas believe it only from the cluster's private networks (the router drops a client's "
                    "own), and the API keys are still checked. Off when unset.")
    prefix_cache_sharing: Literal["tenant", "shared"] = Field(
        default="tenant", description="Whose prefix cache blocks a request may reuse: tenant (its own tenant's, or "
                                      "its keys' cache_group's: no tenant can time another's prompts) or shared "
                                      "(everyone's: one prefill of a prompt common to all tenants). "
                                      "docs/runtime.md, Prefix cache isolation.")


_TENANTS = "!has(self.tenants) || "
ONE_KEYS_SECRET = cel(
    _TENANTS + "!has(self.apiKeySecretRef)",
    "tenants.secretRef and apiKeySecretRef both name the API keys' Secret: give one (tenants.secretRef for keys "
    "that name tenants, weights and priorities)",
)
_TENANTS_POLICY = "(has(self.tenants.schedulingPolicy) ? self.tenants.schedulingPolicy : 'fair')"
ONE_SCHEDULING_POLICY = cel(
    _TENANTS + "!has(self.runtime) || !has(self.runtime.schedulingPolicy) || self.runtime.schedulingPolicy == "
    f"'fcfs' || self.runtime.schedulingPolicy == {_TENANTS_POLICY}",
    "with spec.tenants the replicas' waiting queue follows tenants.schedulingPolicy (fair unless set): leave "
    "runtime.schedulingPolicy unset",
)
TENANT_CAP_NEEDS_ROUTER = cel(
    _TENANTS + "!has(self.tenants.maxInFlightPerTenant) || (has(self.router) && (!has(self.router.enabled) || "
    "self.router.enabled))",
    "tenants.maxInFlightPerTenant is enforced by the router: add spec.router, or remove the cap",
)
ONE_TENANT_CAP = cel(
    _TENANTS + "!has(self.tenants.maxInFlightPerTenant) || !has(self.router) || "
    "!has(self.router.maxInFlightPerTenant)",
    "set maxInFlightPerTenant once: in tenants or in router, not both",
)
RULES = (ONE_KEYS_SECRET, ONE_SCHEDULING_POLICY, TENANT_CAP_NEEDS_ROUTER, ONE_TENANT_CAP)


def tenant_errors(tenants: TenantsSpec | None, api_key_secret_ref: SecretKeyRef | None, runtime_policy: str,
                  router) -> list[str]:
    """The messages of the rules above that the spec breaks (pydantic's side of the CEL rules)."""
    if tenants is None:
        return []
    errors = []
    if api_key_secret_ref is not None:
        errors.append(ONE_KEYS_SECRET["message"])
    if runtime_policy not in ("fcfs", tenants.scheduling_policy):
        errors.append(ONE_SCHEDULING_POLICY["message"])
    if tenants.max_in_flight_per_tenant is not None:
        if router is None or not router.enabled:
            errors.append(TENANT_CAP_NEEDS_ROUTER["message"])
        if router is not None and router.max_in_flight_per_tenant is not None:
            errors.append(ONE_TENANT_CAP["message"])
    return errors
