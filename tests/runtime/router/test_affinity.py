"""Prefix hashing, the prefix index and the bounded-load pick: pure, no network."""
import pytest

from kubeinfer.runtime.router.affinity import (Candidate, PrefixIndex, Weights, chunk_hashes, load_cap, pick,
                                               prompt_text)

SYSTEM = "You are a careful assistant for Kubernetes operators. " * 4   # 216 characters: three full chunks


def test_chunk_hashes_chain_so_equal_hashes_mean_equal_prefixes():
    a = chunk_hashes(SYSTEM + "first user", 64, 100)
    b = chunk_hashes(SYSTEM + "second user, longer question here" * 3, 64, 100)
    assert len(a) == len(SYSTEM + "first user") // 64 == 3
    assert a == b[:3]
    # the same chunk text after a different prefix hashes differently
    shifted = chunk_hashes("x" * 64 + SYSTEM, 64, 100)
    assert not set(shifted) & set(a)
    assert chunk_hashes("short", 64, 100) == []
    assert len(chunk_hashes("y" * 6400, 64, 5)) == 5


def test_prompt_text_of_chat_extends_with_each_turn():
    turn1 = {"messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "hi"}]}
    turn2 = {"messages": turn1["messages"] + [{"role": "assistant", "content": "hello"},
                                              {"role": "user", "content": "more"}]}
    assert prompt_text(turn2).startswith(prompt_text(turn1))
    parts = {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]}
    assert prompt_text(parts) == prompt_text({"messages": [{"role": "user", "content": "ab"}]})
    assert prompt_text({"prompt": "abc"}) == "abc"
    assert prompt_text({"prompt": ["abc", "def"]}) == "abc"


def test_prompt_text_of_a_responses_request_is_its_instructions_and_input_as_chat():
    chat = {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "ab"}]}
    assert prompt_text({"instructions": "be brief", "input": "ab"}) == prompt_text(chat)
    items = {"instructions": "be brief", "input": [{"role": "user", "content": [{"type": "input_text", "text": "ab"}]},
                                                   {"type": "function_call_output", "call_id": "c", "output": "x"}]}
    assert prompt_text(items) == prompt_text(chat)
    assert prompt_text({"input": "ab"}) == prompt_text({"messages": [{"role": "user", "content": "ab"}]})
    assert prompt_text({"prompt": [1, 2, 3]}) == "1 2 3"
    assert prompt_text({"messages": None}) == ""


def test_index_reports_each_replicas_longest_match_and_forgets_the_oldest():
    index = PrefixIndex(max_entries=5)
    long_prompt = chunk_hashes("a" * 64 * 4, 64, 100)
    index.record(long_prompt[:2], "r1")
    index.record(long_prompt, "r2")
    assert index.matches(long_prompt) == {"r2": 4, "r1": 2}
    assert index.matches(chunk_hashes("b" * 128, 64, 100)) == {}
    index.record(chunk_hashes("c" * 128, 64, 100), "r3")   # 6 entries > 5: the least recently used one goes
    assert len(index) == 5
    assert index.matches(long_prompt[:1]) == {}     # the first chunk's entry was the oldest
    assert index.matches(long_prompt) == {"r2": 4, "r1": 2}   # a chained hash stands for its whole prefix


def test_index_keeps_at_most_max_owners_per_prefix():
    index = PrefixIndex(max_owners=2)
    hashes = chunk_hashes("a" * 64, 64, 10)
    for replica in ("r1", "r2", "r3"):
        index.record(hashes, replica)
    assert set(index.matches(hashes)) == {"r2", "r3"}


def test_load_cap_is_ceil_of_one_plus_epsilon_times_the_mean():
    assert load_cap([0, 0, 0], 0.25) == 1
    assert load_cap([4, 4, 3], 0.25) == 5     # (1.25 * 12 / 3) = 5
    assert load_cap([10, 0], 0.0) == 6


def idle(*names: str) -> list[Candidate]:
    return [Candidate(name, 0) for name in names]


def test_pick_follows_the_longest_match():
    assert pick(idle("a", "b", "c"), {"b": 3, "c": 1}, 4, Weights()) == ("b", "prefix")


def test_pick_skips_a_replica_over_the_load_bound():
    candidates = [Candidate("a", 5), Candidate("b", 1), Candidate("c", 1)]   # cap = ceil(1.25 * 8 / 3) = 4
    name, reason = pick(candidates, {"a": 4}, 4, Weights(epsilon=0.25))
    assert name in ("b", "c") and reason == "bounded"
    # with a looser bound the hot replica keeps its prefix
    assert pick(candidates, {"a": 4}, 4, Weights(epsilon=2.0)) == ("a", "prefix")


def test_one_hot_prefix_spreads_when_it_alone_would_overload_one_replica():
    def spread(epsilon: float) -> list[int]:
        in_flight = {"a": 0, "b": 0, "c": 0}
        matches: dict[str, int] = {}
        for _ in range(30):   # 30 concurrent requests with the same prefix, none finishing
            name, _ = pick([Candidate(n, k) for n, k in in_flight.items()], matches, 4, Weights(epsilon=epsilon))
            in_flight[name] += 1
            matches.setdefault(name, 4)
        return sorted(in_flight.values())
    tight = spread(0.25)
    assert tight[-1] <= 1.25 * 30 / 3 + 1 and tight[0] > 0
    default = spread(Weights().epsilon)   # 1.0: the prefix stays on two replicas, none over 1.5x the mean
    assert default[-1] <= 1.5 * 30 / 3 and default[-2] > 0, default


def test_without_a_match_load_decides_then_kv_use():
    candidates = [Candidate("a", 3), Candidate("b", 1, waiting=1), Candidate("c", 1, kv_usage=0.9)]
    assert pick(candidates, {}, 4, Weights()) == ("b", "load")


def test_stale_replica_reads_as_fully_loaded():
    candidates = [Candidate("a", 0, stale=True), Candidate("b", 2)]
    assert pick(candidates, {}, 0, Weights(epsilon=10)) == ("b", "load")


def test_new_prefixes_spread_over_idle_replicas():
    chosen = {pick(idle("a", "b", "c"), {}, 0, Weights(), prefix_key=key)[0] for key in range(40)}
    assert chosen == {"a", "b", "c"}


def test_weights_refuse_negative_values():
    with pytest.raises(ValueError, match="load weight"):
        Weights(load=-1)


def test_footprint_counts_the_chunks_each_replica_owns_through_truncation_and_eviction():
    index = PrefixIndex(max_entries=4, max_owners=1)
    index.record(chunk_hashes("a" * 192, 64, 10), "r1")     # 3 chunks
    index.record(chunk_hashes("a" * 64, 64, 10), "r2")      # takes over the first chunk (one owner at most)
    assert index.footprint == {"r1": 2, "r2": 1}
    index.record(chunk_hashes("b" * 128, 64, 10), "r2")     # 5 entries > 4: the oldest (r1's 2nd chunk) goes
    assert len(index) == 4
    assert index.footprint == {"r1": 1, "r2": 3}


def test_forget_drops_a_replica_from_every_prefix_and_its_footprint():
    index = PrefixIndex()
    shared, own = chunk_hashes("a" * 128, 64, 10), chunk_hashes("b" * 192, 64, 10)
    index.record(shared, "r1")
    index.record(shared, "r2")
    index.record(own, "r1")
    index.forget("r1")
    assert index.matches(shared) == {"r2": 2} and index.matches(own) == {}
    assert len(index) == 2   # r1's own prefix had no other owner: its entries are gone
    assert index.footprint == {"r2": 2}
    index.record(own, "r1")   # back, empty: it owns what it is sent from now on
    assert index.matches(own) == {"r1": 3} and index.footprint == {"r2": 2, "r1": 3}


def test_a_new_prefix_goes_where_the_least_prefix_text_is_kept():
    footprint = {"a": 120, "b": 30, "c": 90}
    assert pick(idle("a", "b", "c"), {}, 4, Weights(), prefix_key=7, footprint=footprint) == ("b", "load")
    # a full match still wins over a smaller footprint
    assert pick(idle("a", "b", "c"), {"a": 4}, 4, Weights(), footprint=footprint) == ("a", "prefix")


def test_chunk_hashes_under_an_adapter_are_another_prefix_than_under_the_base_or_another_adapter():
    base = chunk_hashes(SYSTEM, 64, 100)
    sql, chat = chunk_hashes(SYSTEM, 64, 100, adapter="sql"), chunk_hashes(SYSTEM, 64, 100, adapter="chat")
    assert len(base) == len(sql) == len(chat) == 3
    assert not set(sql) & set(base) and not set(sql) & set(chat) and not set(chat) & set(base)
    assert chunk_hashes(SYSTEM, 64, 100, adapter=None) == base   # the base model's hashes are as before
    assert chunk_hashes(SYSTEM + "more text, a longer prompt" * 3, 64, 100, adapter="sql")[:3] == sql
