"""Tenants: the keys file names them (with weights and priorities), each request's tenant comes from its key alone,
and the per-tenant counters add up to the totals (the per-tenant busy seconds to the engine's step time)."""
import httpx
import pytest

from kubeinfer.runtime.errors import ConfigError
from kubeinfer.runtime.server.auth import ANONYMOUS, KeyRing, key_tenant_name, parse_api_keys
from support import metric_value, scrape_metrics


def test_the_keys_file_names_tenants_with_weights_and_priorities():
    keys = parse_api_keys("alpha-key 500 tenant=alpha weight=3 priority=-1\nbeta-key\n# comment\n")
    ring = KeyRing(keys)
    assert ring.tenant("alpha-key").name == "alpha" and ring.tenant("alpha-key").weight == 3
    assert ring.tenant("alpha-key").priority == -1 and ring.limit("alpha-key") == 500
    beta = ring.tenant("beta-key")
    assert beta.name == key_tenant_name("beta-key") and "beta" not in beta.name   # the key is never shown
    assert (beta.weight, beta.priority, ring.limit("beta-key")) == (1.0, 0, None)
    assert ring.tenant(None) == ANONYMOUS


@pytest.mark.parametrize("line, message", [
    ("k weight=0", "weight=W (a positive number)"), ("k weight=nan", "weight=W"), ("k priority=high", "priority=P"),
    ("k tenant=a/b", "tenant=NAME"), ("k color=red", "'color'"), ("k 0 tenant=a", "TOKENS_PER_MINUTE"),
])
def test_a_bad_tenant_option_names_the_line_and_the_syntax(line, message):
    with pytest.raises(ConfigError) as error:
        parse_api_keys("good\n" + line)
    assert "line 2" in str(error.value) and message in str(error.value)
    assert "k " not in str(error.value)   # nor the key


def test_per_tenant_counters_come_from_the_key_and_add_up_to_the_totals(llama_dir, start_server, tmp_path):
    keys = tmp_path / "keys"
    keys.write_text("alpha-key tenant=alpha weight=3\nbeta-key tenant=beta\n")
    with start_server(llama_dir, str(keys), max_model_len=256) as (url, _):
        before = scrape_metrics(url)
        assert metric_value(before, "kubeinfer_tenant_prompt_tokens_total", model_name="tiny", tenant="beta") == 0
        sent = {"alpha": 0, "beta": 0}
        for key, tenant, n in (("alpha-key", "alpha", 3), ("beta-key", "beta", 2)):
            for i in range(n):
                body = {"model": "tiny", "prompt": f"request {i} of {tenant}", "max_tokens": 5, "ignore_eos": True,
                        "tenant": "alpha"}   # a client cannot name its tenant: ignored
                response = httpx.post(url + "/v1/completions", json=body, timeout=60,
                                      headers={"Authorization": f"Bearer {key}"})
                assert response.status_code == 200, response.text
                sent[tenant] += response.json()["usage"]["prompt_tokens"]
        metrics = scrape_metrics(url)

    def total(name, **labels):
        return metric_value(metrics, name, model_name="tiny", **labels)
    for tenant, prompt_tokens in sent.items():
        assert total("kubeinfer_tenant_prompt_tokens_total", tenant=tenant) == prompt_tokens
        assert total("kubeinfer_tenant_requests_total", tenant=tenant, finished_reason="length") == \
            (3 if tenant == "alpha" else 2)
    for name in ("prompt_tokens", "generation_tokens"):
        assert total(f"kubeinfer_{name}_total") == sum(
            total(f"kubeinfer_tenant_{name}_total", tenant=t) for t in ("alpha", "beta", "anonymous"))
    assert total("kubeinfer_tenant_generation_tokens_total", tenant="beta") == 10
    # The engine's step time, shared out by the tokens each tenant computed: all of it, to the tenants that sent
    busy = {t: total("kubeinfer_tenant_busy_seconds_total", tenant=t) for t in ("alpha", "beta", "anonymous")}
    assert busy["alpha"] > 0 and busy["beta"] > 0 and busy["anonymous"] == 0
    assert sum(busy.values()) == pytest.approx(total("kubeinfer_engine_step_seconds_sum"), rel=1e-9)
    assert total("kubeinfer_replica_accelerators") == 0   # a CPU replica
