"""What the router reads from a replica's /metrics."""
from kubeinfer.runtime.router.replicas import parse_gauges

EXPOSITION = """# HELP kubeinfer_num_requests_running Requests in the running batch
# TYPE kubeinfer_num_requests_running gauge
kubeinfer_num_requests_running{model_name="tiny"} 3.0
kubeinfer_num_requests_waiting{model_name="tiny"} 7.0
kubeinfer_kv_cache_usage_ratio{model_name="tiny"} 0.5
kubeinfer_num_requests_waiting_other{model_name="tiny"} 99.0
vllm:num_requests_waiting{model_name="tiny"} 7.0
kubeinfer_prefix_cache_hits_total{model_name="tiny"} 12.0
"""


def test_parse_gauges_reads_the_three_gauges_and_the_model_name():
    values, model = parse_gauges(EXPOSITION)
    assert values == {"running": 3.0, "waiting": 7.0, "kv_usage": 0.5}
    assert model == "tiny"


def test_parse_gauges_of_an_unrelated_exposition_is_empty():
    assert parse_gauges("# nothing\nup 1\n") == ({}, None)
