"""A gateway's tenant header (`--trusted-tenant-header`, runtime/server/trusted_header.py): believed only from the
trusted networks, a bad value a 400 naming the header, and the router drops it from a client it does not trust
(the replicas trust the router's address, so a client must not get its own header through)."""
import httpx
import openai
import pytest

from kubeinfer.runtime.errors import ConfigError, InvalidRequestError
from kubeinfer.runtime.router.tenants import TenantGate
from kubeinfer.runtime.server.auth import KeyRing, parse_api_keys
from kubeinfer.runtime.server.trusted_header import TrustedTenantHeader, tenant_for
from support import metric_value, scrape_metrics

HEADER = [(b"x-tenant", b"acme")]


def test_the_header_is_believed_only_from_trusted_networks():
    trusted = TrustedTenantHeader("X-Tenant")
    assert trusted.named(HEADER, "127.0.0.1") == "acme" and trusted.named(HEADER, "10.244.0.7") == "acme"
    assert trusted.named(HEADER, "203.0.113.9") is None and trusted.named(HEADER, None) is None
    assert trusted.named([(b"x-other", b"acme")], "127.0.0.1") is None
    assert TrustedTenantHeader(None).named(HEADER, "127.0.0.1") is None   # off by default
    assert TrustedTenantHeader("x-tenant", ["10.0.0.0/8"]).named(HEADER, "127.0.0.1") is None
    with pytest.raises(InvalidRequestError) as error:
        trusted.named([(b"x-tenant", b"a/b")], "127.0.0.1")
    assert error.value.param == "x-tenant"
    with pytest.raises(ConfigError, match="trusted-tenant-networks"):
        TrustedTenantHeader("x-tenant", ["not-a-network"])
    with pytest.raises(ConfigError, match="trusted-tenant-header"):
        TrustedTenantHeader("x tenant")


def test_a_named_tenant_takes_its_keys_file_settings():
    keys = KeyRing(parse_api_keys("gw-key tenant=gateway\nk2 tenant=acme weight=3 cache_group=g\n"))
    assert tenant_for(keys, "gw-key", None).name == "gateway"
    acme = tenant_for(keys, "gw-key", "acme")
    assert (acme.name, acme.weight, acme.cache_group) == ("acme", 3, "g")
    assert tenant_for(keys, "gw-key", "newcomer").weight == 1.0


def test_the_router_drops_the_header_of_a_client_it_does_not_trust(tmp_path):
    keys = tmp_path / "keys"
    keys.write_text("gw-key tenant=gateway\n")
    gate = TenantGate(str(keys), None, TrustedTenantHeader("x-tenant", ["10.0.0.0/8"]))
    headers = [(b"authorization", b"Bearer gw-key"), *HEADER]
    assert gate.tenant(headers, "10.1.2.3").name == "acme"
    assert gate.forwarded(headers, "10.1.2.3") == headers
    assert gate.tenant(headers, "203.0.113.9").name == "gateway"
    assert gate.forwarded(headers, "203.0.113.9") == headers[:1]


def test_the_server_counts_and_isolates_the_tenant_the_gateway_names(llama_dir, start_server, tmp_path):
    keys = tmp_path / "keys"
    keys.write_text("gw-key tenant=gateway\n")
    with start_server(llama_dir, str(keys), max_model_len=256, trusted_tenant_header="X-Tenant") as (url, _):
        def complete(tenant=None, prompt="The gateway says: " * 8):
            client = openai.OpenAI(base_url=url + "/v1", api_key="gw-key", max_retries=0,
                                   default_headers={"X-Tenant": tenant} if tenant else None)
            return client.completions.create(model="tiny", prompt=prompt, max_tokens=2, temperature=0)
        assert complete("acme").usage.prompt_tokens_details.cached_tokens == 0
        assert complete("globex").usage.prompt_tokens_details.cached_tokens == 0   # another tenant: isolated
        assert complete("acme").usage.prompt_tokens_details.cached_tokens > 0
        complete()   # no header: the key's own tenant
        metrics = scrape_metrics(url)
        for tenant, count in (("acme", 2), ("globex", 1), ("gateway", 1)):
            assert metric_value(metrics, "kubeinfer_tenant_requests_total", model_name="tiny", tenant=tenant,
                                finished_reason="length") == count
        reply = httpx.post(url + "/v1/completions", json={"model": "tiny", "prompt": "x", "max_tokens": 1},
                           headers={"Authorization": "Bearer gw-key", "X-Tenant": "not a name"}, timeout=60)
        assert reply.status_code == 400 and reply.json()["error"]["param"] == "x-tenant"
        # without the key, the header opens nothing
        assert httpx.post(url + "/v1/completions", json={"model": "tiny", "prompt": "x", "max_tokens": 1},
                          headers={"X-Tenant": "acme"}, timeout=60).status_code == 401


def test_from_an_untrusted_network_the_header_is_ignored(llama_dir, start_server, tmp_path):
    keys = tmp_path / "keys"
    keys.write_text("gw-key tenant=gateway\n")
    with start_server(llama_dir, str(keys), max_model_len=256, trusted_tenant_header="X-Tenant",
                      trusted_tenant_networks=("10.0.0.0/8",)) as (url, _):
        client = openai.OpenAI(base_url=url + "/v1", api_key="gw-key", max_retries=0,
                               default_headers={"X-Tenant": "acme"})
        client.completions.create(model="tiny", prompt="hello", max_tokens=2)
        metrics = scrape_metrics(url)
        assert metric_value(metrics, "kubeinfer_tenant_requests_total", model_name="tiny", tenant="gateway",
                            finished_reason="length") == 1
        assert not metric_value(metrics, "kubeinfer_tenant_requests_total", model_name="tiny", tenant="acme",
                                finished_reason="length")
