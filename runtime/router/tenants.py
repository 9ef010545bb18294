"""Tenants at the router: whose request it is (the key in its `Authorization` header, read from the same keys file
as the replicas'), and a cap on each tenant's requests open here (waiting for a replica or in flight on one), so
that one tenant's flood cannot take the router's waiting room or every replica slot. The replicas still check the
keys, quotas and their own fair queue; the router counts, and lets requests out of its waiting room in a tenant-fair
order (router/waiting_room.py)."""
from kubeinfer.runtime.errors import InvalidRequestError
from kubeinfer.runtime.server.auth import KeyRing, Tenant, load_api_keys
from kubeinfer.runtime.server.trusted_header import TrustedTenantHeader, tenant_for
from kubeinfer.runtime.router import relayed
from kubeinfer.runtime.router.waiting_room import Refused

RETRY_AFTER_SECONDS = 1.0


class TenantGate:
    def __init__(self, keys_file: str | None, max_in_flight: int | None,
                 trusted_header: TrustedTenantHeader | None = None):
        self.keys = KeyRing(load_api_keys(keys_file, env={}) if keys_file else {})
        self.max_in_flight = max_in_flight
        self.trusted_header = trusted_header or TrustedTenantHeader(None)
        self.open: dict[str, int] = {}   # tenant -> its requests open here

    def tenant(self, headers: list[tuple[bytes, bytes]], peer: str | None = None) -> Tenant:
        """The tenant of a request (name, weight, priority): a trusted gateway's header's (`trusted_header`), else
        its key's, or anonymous (no key, or a key the replicas will refuse). A bad header value reads as no header
        here: the replica answers it with its 400."""
        key = None
        if self.keys.enabled:
            key = self.keys.authenticate((relayed.authorization(headers) or b"").decode(errors="replace"))
        try:
            named = self.trusted_header.named(headers, peer)
        except InvalidRequestError:
            named = None
        return tenant_for(self.keys, key, named)

    def forwarded(self, headers: list[tuple[bytes, bytes]], peer: str | None) -> list[tuple[bytes, bytes]]:
        """The headers to send on: the tenant header dropped unless its sender is trusted (the replicas trust the
        router's address, so a client must not get its own header past the router)."""
        return headers if self.trusted_header.trusts(peer) else self.trusted_header.strip(headers)

    def enter(self, tenant: str) -> None:
        """Counts the request in, or refuses it (429) when its tenant is at its cap."""
        count = self.open.get(tenant, 0)
        if self.max_in_flight is not None and count >= self.max_in_flight:
            raise Refused(429, f"too many requests in flight for this API key ({self.max_in_flight} at most); "
                               "retry later", "tenant_busy", RETRY_AFTER_SECONDS)
        self.open[tenant] = count + 1

    def leave(self, tenant: str) -> None:
        self.open[tenant] -= 1
