"""A tenant named by a gateway in front (`--trusted-tenant-header NAME`, off by default; docs/server.md, Tenants).

Gateways that authenticate users themselves (an API gateway, an AI gateway) pass the user's tenant in a header.
The server and the router take it only when the flag names that header and the request comes from a trusted
network (`--trusted-tenant-networks`, by default loopback and the private ranges: the pods and the router, never the
internet); from anywhere else the header is ignored, and the router drops it before forwarding, so a client cannot
name its own tenant by sending it through the router. The tenant named gets the weight, priority and cache group
its line of the keys file gives it, or the defaults. The API keys, when configured, are still checked: the header
names whose request it is, not who may send it.
"""
import ipaddress
import re
from collections.abc import Iterable

from kubeinfer.runtime.config import KV_SOURCE_NETWORKS as TRUSTED_NETWORKS   # loopback and the private ranges
from kubeinfer.runtime.errors import ConfigError, InvalidRequestError
from kubeinfer.runtime.server.auth import NAME_PATTERN, KeyRing, Tenant


class TrustedTenantHeader:
    def __init__(self, name: str | None, networks: Iterable[str] = TRUSTED_NETWORKS):
        if name is not None and not re.fullmatch(r"[A-Za-z0-9-]{1,64}", name):
            raise ConfigError(f"--trusted-tenant-header {name!r}: expected a header name (letters, digits, -)")
        self.name = name.lower().encode() if name else None
        try:
            self.networks = [ipaddress.ip_network(network) for network in networks]
        except ValueError as error:
            raise ConfigError(f"--trusted-tenant-networks: {error}") from None

    def trusts(self, peer: str | None) -> bool:
        """Whether a request from `peer` (an IP address) may name its tenant by the header."""
        try:
            address = ipaddress.ip_address(peer) if peer else None
        except ValueError:
            return False
        return address is not None and any(address in network for network in self.networks)

    def named(self, headers: Iterable[tuple[bytes, bytes]], peer: str | None) -> str | None:
        """The tenant the header names: None when the flag is off, the header absent or the peer not trusted; a
        value that is not a tenant name is a 400 naming the header."""
        if self.name is None or not self.trusts(peer):
            return None
        value = next((v for k, v in headers if k.lower() == self.name), None)
        if value is None:
            return None
        text = value.decode(errors="replace").strip()
        if not re.fullmatch(NAME_PATTERN, text):
            raise InvalidRequestError(f"header {self.name.decode()}: {text[:64]!r} is not a tenant name (letters, "
                                      "digits, _ . -; at most 63)", self.name.decode())
        return text

    def strip(self, headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
        """The headers without this one (the router, for a request from an untrusted peer)."""
        return headers if self.name is None else [(k, v) for k, v in headers if k.lower() != self.name]


def tenant_for(keys: KeyRing, key: str | None, named: str | None) -> Tenant:
    """The request's tenant: the one the trusted header names (its keys-file line's settings, if any), else its
    key's."""
    if named is None:
        return keys.tenant(key)
    return next((entry.tenant for entry in keys.keys.values() if entry.tenant.name == named), Tenant(named))
