"""Prefix cache isolation through the API (docs/runtime.md, "Prefix cache isolation"), with the official openai
client: by default each API key's tenant reuses only its own prefix blocks (usage's cached_tokens says so), tenants
of one cache_group share, `--prefix-cache-sharing shared` shares among all, and a request's cache_salt keeps its
prefix to requests with the same salt. A bad salt is a 400 naming cache_salt."""
import uuid

import openai
import pytest

from kubeinfer.runtime.errors import ConfigError
from kubeinfer.runtime.server.auth import parse_api_keys

KEYS = "alpha-key tenant=alpha\nbeta-key tenant=beta\nteam1-key tenant=team1 cache_group=acme\n" \
       "team2-key tenant=team2 cache_group=acme\n"
SYSTEM = "You are a careful assistant. Answer in one short sentence, and say when you are not sure. " * 2


@pytest.fixture(scope="module")
def keys_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("keys") / "keys"
    path.write_text(KEYS)
    return str(path)


def cached_tokens(url: str, key: str, prompt: str, **extra) -> int:
    client = openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0)
    completion = client.completions.create(model="tiny", prompt=prompt, max_tokens=2, temperature=0,
                                           extra_body=extra or None)
    return completion.usage.prompt_tokens_details.cached_tokens


def test_by_default_a_tenant_reuses_only_its_own_and_its_groups_prefixes(llama_dir, start_server, keys_file):
    with start_server(llama_dir, keys_file, max_model_len=256) as (url, _):
        prompt = SYSTEM + uuid.uuid4().hex
        assert cached_tokens(url, "alpha-key", prompt) == 0
        assert cached_tokens(url, "beta-key", prompt) == 0   # another tenant: computed again
        assert cached_tokens(url, "alpha-key", prompt) > 0
        assert cached_tokens(url, "team1-key", prompt) == 0
        assert cached_tokens(url, "team2-key", prompt) > 0   # the same cache_group: they trust each other
        salted = uuid.uuid4().hex + SYSTEM   # a prefix nobody sent yet
        assert cached_tokens(url, "alpha-key", salted, cache_salt="s1") == 0
        assert cached_tokens(url, "alpha-key", salted) == 0
        assert cached_tokens(url, "alpha-key", salted, cache_salt="s1") > 0


def test_shared_sharing_lets_every_tenant_reuse_a_prefix(llama_dir, start_server, keys_file):
    with start_server(llama_dir, keys_file, max_model_len=256, prefix_cache_sharing="shared") as (url, _):
        prompt = SYSTEM + uuid.uuid4().hex
        assert cached_tokens(url, "alpha-key", prompt) == 0
        assert cached_tokens(url, "beta-key", prompt) > 0
        assert cached_tokens(url, "beta-key", prompt, cache_salt="mine") == 0   # a salt still keeps it apart


@pytest.mark.parametrize("salt", ["", "x" * 1025, 5, ["a"]])
def test_a_bad_cache_salt_is_a_400_naming_it(server, salt):
    url, _ = server
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError) as error:
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=2,
                                       extra_body={"cache_salt": salt})
    assert error.value.body["param"] == "cache_salt", error.value.body


def test_cache_group_in_the_keys_file():
    keys = parse_api_keys("k1 tenant=a cache_group=acme\nk2 tenant=b\n")
    assert keys["k1"].tenant.cache_scope("tenant") == ("group", "acme")
    assert keys["k2"].tenant.cache_scope("tenant") == ("tenant", "b")
    assert keys["k1"].tenant.cache_scope("shared") is None
    with pytest.raises(ConfigError, match="line 1.*cache_group=NAME"):
        parse_api_keys("k1 cache_group=a/b\n")
