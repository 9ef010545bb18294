"""The three policies over replica state as the scrapes left it (no network)."""
import time

from kubeinfer.runtime.router.affinity import cache_scope
from kubeinfer.runtime.router.policies import Chooser
from kubeinfer.runtime.router.replicas import Replica
from kubeinfer.runtime.router.settings import RouterSettings
from kubeinfer.runtime.server.auth import Tenant

URLS = ["http://10.0.0.1:8000", "http://10.0.0.2:8000", "http://10.0.0.3:8000"]
LONG = "You are a helpful assistant that knows Kubernetes. " * 10


def fresh(url: str, **state) -> Replica:
    return Replica(url, up=True, scraped_at=time.monotonic(), **state)


def test_round_robin_cycles_over_the_available_replicas():
    chooser = Chooser(RouterSettings(URLS, policy="round-robin"))
    replicas = [fresh(url) for url in URLS]
    assert [chooser.choose(replicas, LONG)[0].url for _ in range(6)] == URLS * 2


def test_least_load_takes_the_fewest_in_flight_and_waiting_and_avoids_stale_data():
    chooser = Chooser(RouterSettings(URLS, policy="least-load"))
    replicas = [fresh(URLS[0], in_flight=1, waiting=3), fresh(URLS[1], in_flight=2), Replica(URLS[2], up=True)]
    assert chooser.choose(replicas, LONG) == (replicas[1], "least_load")   # the third was never scraped: stale


def test_prefix_policy_follows_a_prefix_it_placed_and_records_at_pick_time():
    chooser = Chooser(RouterSettings(URLS))
    replicas = [fresh(url) for url in URLS]
    first, reason = chooser.choose(replicas, LONG + "question one")
    assert reason == "load"
    again, reason = chooser.choose(replicas, LONG + "question two")   # nothing told it the first one finished
    assert (again, reason) == (first, "prefix")
    # with one request of it running there, a second still goes there: cap = ceil(2 x 2 / 3) = 2
    first.in_flight = 1
    assert chooser.choose(replicas, LONG + "question three") == (first, "prefix")
    # with two, a third is over the bound (cap = ceil(2 x 3 / 3) = 2): it goes elsewhere
    first.in_flight = 2
    other, reason = chooser.choose(replicas, LONG + "question four")
    assert other is not first and reason == "bounded"


def test_prefix_policy_stops_following_a_prefix_to_a_replica_it_forgot():
    chooser = Chooser(RouterSettings(URLS))
    replicas = [fresh(url) for url in URLS]
    first, _ = chooser.choose(replicas, LONG + "question one")
    chooser.forget(first)   # say it refused a connection: restarted, its cache empty
    others = [r for r in replicas if r is not first]
    moved, reason = chooser.choose(others, LONG + "question two")   # while it is down
    assert reason == "load"
    back, reason = chooser.choose(replicas, LONG + "question three")   # it is up again: the prefix is elsewhere
    assert (back, reason) == (moved, "prefix")


def test_prefix_policy_keeps_affinity_per_adapter_never_across_adapters():
    chooser = Chooser(RouterSettings(URLS))
    replicas = [fresh(url) for url in URLS]
    under_sql, reason = chooser.choose(replicas, LONG + "question one", adapter="sql")
    assert reason == "load"
    # the same prompt under another adapter (or the base model) holds no prefix anywhere: KV is per adapter
    assert chooser.choose(replicas, LONG + "question two", adapter="chat")[1] == "load"
    assert chooser.choose(replicas, LONG + "question three")[1] == "load"
    # under the first adapter again, it follows its prefix
    assert chooser.choose(replicas, LONG + "question four", adapter="sql") == (under_sql, "prefix")


def test_prefix_policy_keys_prefixes_by_tenant_scope_and_salt_as_the_replicas_do():
    """Under `--prefix-cache-sharing tenant` another tenant's prefix is no prefix of this one (the replicas keep it
    apart, so following it would only concentrate load); a trust group's is; a salt keeps its own."""
    chooser = Chooser(RouterSettings(URLS))
    replicas = [fresh(url) for url in URLS]
    alpha, beta = Tenant("alpha"), Tenant("beta")
    team1, team2 = Tenant("team1", cache_group="acme"), Tenant("team2", cache_group="acme")

    def choose(tenant, text, sharing="tenant", **body):
        return chooser.choose(replicas, text, scope=cache_scope(tenant, body, sharing))

    placed, reason = choose(alpha, LONG + "one")
    assert reason == "load"
    assert choose(beta, LONG + "two")[1] == "load"
    assert choose(alpha, LONG + "three") == (placed, "prefix")
    grouped, _ = choose(team1, "group " + LONG)
    assert choose(team2, "group " + LONG + "x") == (grouped, "prefix")
    assert choose(alpha, "salt " + LONG, cache_salt="s")[1] == "load"
    assert choose(alpha, "salt " + LONG + "y")[1] == "load"
    assert choose(alpha, "salt " + LONG + "z", cache_salt="s")[1] == "prefix"
    shared, _ = choose(alpha, "shared " + LONG, sharing="shared")
    assert choose(beta, "shared " + LONG + "w", sharing="shared") == (shared, "prefix")
