"""Prometheus metrics of the runtime (names in docs/contracts.md), every series labelled `model_name`.

Updated on the event loop from each engine step's message; served at `/metrics`. Buckets resolve a P95 of tens of
milliseconds (TTFT, inter-token latency).
"""

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from kubeinfer.runtime.engine.messages import EngineStats
from kubeinfer.runtime.engine.output_processor import RequestOutput
from kubeinfer.runtime.server.kv_metrics import KVTransferMetrics
from kubeinfer.runtime.server.lora_metrics import LoraMetrics
from kubeinfer.runtime.server.sleep_metrics import SleepMetrics

TTFT_BUCKETS = (0.005, 0.01, 0.02, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6, 0.75,
                1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 60.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.0125, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.06, 0.075,
               0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5)
# Tokens per request: prompts every 128 tokens up to 4,096 (the autoscaler counts a prompt as answerable within the
# TTFT target only if its bucket's upper bound is, so the width is its error), then coarser; outputs by half octaves.
PROMPT_TOKEN_BUCKETS = tuple(range(128, 4097, 128)) + (5120, 6144, 7168, 8192, 12288, 16384, 32768, 65536, 131072)
GENERATION_TOKEN_BUCKETS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048,
                            4096, 8192, 16384, 32768)
# Sums over engine steps of a step's decoding sequences n, prefill tokens p, seconds t, and their products: with
# the step count and seconds (kubeinfer_engine_step_seconds), a least-squares fit t ~ a + b n + c p over any window
# (the operator's predictive autoscaler calibrates its replica model so).
STEP_MOMENTS = ("n", "p", "nn", "np", "pp", "nt", "pt")
E2E_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 45.0, 60.0, 90.0,
               120.0, 180.0, 300.0, 600.0)


class EngineMetrics:
    def __init__(self, model_name: str, vllm_names: bool = True, max_loras: int = 0):
        self.registry = CollectorRegistry()
        self._children: dict = {}
        labels = ["model_name"]

        def metric(kind, name, doc, extra=(), **kwargs):
            return kind(name, doc, labels + list(extra), registry=self.registry, **kwargs)

        self.running = metric(Gauge, "kubeinfer_num_requests_running", "Requests in the running batch")
        self.waiting = metric(Gauge, "kubeinfer_num_requests_waiting", "Requests queued, not yet running")
        self.kv_usage = metric(Gauge, "kubeinfer_kv_cache_usage_ratio", "Share of KV cache blocks in use (0-1)")
        self.ttft = metric(Histogram, "kubeinfer_time_to_first_token_seconds", "Time to first token",
                           buckets=TTFT_BUCKETS)
        self.itl = metric(Histogram, "kubeinfer_inter_token_latency_seconds", "Time between two tokens",
                          buckets=ITL_BUCKETS)
        self.e2e = metric(Histogram, "kubeinfer_e2e_request_latency_seconds", "Arrival to last token",
                          buckets=E2E_BUCKETS)
        self.step = metric(Histogram, "kubeinfer_engine_step_seconds", "Duration of one engine step",
                           buckets=ITL_BUCKETS)
        self.step_moments = metric(Counter, "kubeinfer_engine_step_moments",
                                   "Sums over engine steps of decoding sequences n, prefill tokens p, seconds t and "
                                   "their products", ["moment"])
        self.request_prompt_tokens = metric(Histogram, "kubeinfer_request_prompt_tokens", "Prompt tokens per request",
                                            buckets=PROMPT_TOKEN_BUCKETS)
        self.request_generation_tokens = metric(Histogram, "kubeinfer_request_generation_tokens",
                                                "Tokens generated per finished request", buckets=GENERATION_TOKEN_BUCKETS)
        self.prompt_tokens = metric(Counter, "kubeinfer_prompt_tokens", "Prompt tokens prefilled")
        self.generation_tokens = metric(Counter, "kubeinfer_generation_tokens", "Tokens generated")
        self.prefix_hits = metric(Counter, "kubeinfer_prefix_cache_hits", "Prompt tokens served from the prefix cache")
        self.prefix_queries = metric(Counter, "kubeinfer_prefix_cache_queries", "Prompt tokens looked up")
        self.preemptions = metric(Counter, "kubeinfer_num_preemptions", "Sequences preempted for recompute")
        self.loop_bans = metric(Counter, "kubeinfer_structured_loop_bans",
                                "Steps where structured output's loop guards banned a token (an answer's block "
                                "repeated 3 times), ended a string that repeats itself or an object that repeated a "
                                "key")
        self.structured_resamples = metric(Counter, "kubeinfer_structured_resamples",
                                           "Held structured answers drawn again after failing their schema's check")
        self.success = metric(Counter, "kubeinfer_request_success", "Finished requests", ["finished_reason"])
        self.errors = metric(Counter, "kubeinfer_request_errors", "Refused or failed requests", ["status_code"])
        self.startup = metric(Gauge, "kubeinfer_startup_phase_seconds", "Seconds each start-up phase took", ["phase"])
        # Per tenant (an API key's tenant, or "anonymous"): label values come from the keys file, never from a client.
        self.tenant_prompt_tokens = metric(Counter, "kubeinfer_tenant_prompt_tokens", "Prompt tokens, by tenant",
                                           ["tenant"])
        self.tenant_cached_tokens = metric(Counter, "kubeinfer_tenant_cached_prompt_tokens",
                                           "Prompt tokens served from the prefix cache, by tenant", ["tenant"])
        self.tenant_generation_tokens = metric(Counter, "kubeinfer_tenant_generation_tokens",
                                               "Tokens generated, by tenant", ["tenant"])
        self.tenant_requests = metric(Counter, "kubeinfer_tenant_requests", "Finished requests, by tenant and reason",
                                      ["tenant", "finished_reason"])
        self.tenant_ttft = metric(Histogram, "kubeinfer_tenant_time_to_first_token_seconds",
                                  "Time to first token (queue and prefill), by tenant", ["tenant"],
                                  buckets=TTFT_BUCKETS)
        # Each engine step's time shared out by the tokens each tenant had computed in it: they add up to
        # kubeinfer_engine_step_seconds_sum. Times the replica's accelerators, its estimated cost (docs/server.md).
        self.tenant_busy = metric(Counter, "kubeinfer_tenant_busy_seconds",
                                  "Engine step time, shared out by the tokens each tenant computed in the step",
                                  ["tenant"])
        self.accelerators = metric(Gauge, "kubeinfer_replica_accelerators",
                                   "GPUs this replica computes on (0: a CPU replica)")
        # Speculative decoding, under vLLM's names (with our prefix); acceptance rate = accepted / draft tokens.
        self.spec = {
            "drafts": metric(Counter, "kubeinfer_spec_decode_num_drafts", "Sequence-steps that verified drafts"),
            "draft_tokens": metric(Counter, "kubeinfer_spec_decode_num_draft_tokens", "Draft tokens proposed"),
            "accepted": metric(Counter, "kubeinfer_spec_decode_num_accepted_tokens", "Draft tokens accepted"),
            "per_position": metric(Counter, "kubeinfer_spec_decode_num_accepted_tokens_per_pos",
                                   "Draft tokens accepted, by position in the draft", ["position"]),
        }
        # Mixture-of-experts models: where the router sends tokens (series appear with the first MoE stats).
        self.expert_tokens = metric(Counter, "kubeinfer_moe_expert_routed_tokens",
                                    "Tokens routed to each expert, summed over the MoE layers", ["expert"])
        self.expert_imbalance = metric(Gauge, "kubeinfer_moe_load_imbalance",
                                       "Busiest expert's routed tokens over the mean, worst layer (1 = even)")
        self._seen_experts: tuple[int, ...] = ()
        self.model_name = model_name
        self.lora = LoraMetrics(self.registry, model_name, max_loras, vllm_names)
        self.kv = KVTransferMetrics(self.registry, model_name)
        self.sleep = SleepMetrics(self.registry, model_name)
        # The model-server contract of the gateways (llm-d's router / the Gateway API Inference Extension's
        # endpoint picker, KServe) reads vLLM's names: the same values under them (docs/server.md).
        self.vllm = None
        self.spec_families = [self.spec]   # the acceptance counters under each name they are exported as
        if vllm_names:
            self.vllm = {
                "running": metric(Gauge, "vllm:num_requests_running", "Requests in the running batch (vLLM name)"),
                "waiting": metric(Gauge, "vllm:num_requests_waiting", "Requests queued (vLLM name)"),
                "kv_usage": metric(Gauge, "vllm:kv_cache_usage_perc", "KV cache usage, 1 = 100% (vLLM name)"),
                "cache_config": metric(Gauge, "vllm:cache_config_info", "KV cache settings (vLLM name)",
                                       ["block_size", "num_gpu_blocks"]),
            }
            self.spec_families.append({
                "drafts": metric(Counter, "vllm:spec_decode_num_drafts", "Draft steps (vLLM name)"),
                "draft_tokens": metric(Counter, "vllm:spec_decode_num_draft_tokens", "Draft tokens (vLLM name)"),
                "accepted": metric(Counter, "vllm:spec_decode_num_accepted_tokens", "Accepted (vLLM name)"),
                "per_position": metric(Counter, "vllm:spec_decode_num_accepted_tokens_per_pos",
                                       "Accepted by position (vLLM name)", ["position"]),
            })
            for gauge in ("running", "waiting", "kv_usage"):
                self.vllm[gauge].labels(model_name)
        # Every series exists from start-up (at 0), so a fresh server is not read as "no data".
        for unlabelled in (self.running, self.waiting, self.kv_usage, self.ttft, self.itl, self.e2e, self.step,
                           self.prompt_tokens, self.generation_tokens, self.prefix_hits, self.prefix_queries,
                           self.preemptions, self.spec["drafts"], self.spec["draft_tokens"], self.spec["accepted"],
                           self.request_prompt_tokens, self.request_generation_tokens):
            unlabelled.labels(model_name)
        for moment in STEP_MOMENTS:
            self.step_moments.labels(model_name, moment)
        for reason in ("stop", "length", "abort"):
            self.success.labels(model_name, reason)
        self._last_token_time: dict[str, float] = {}
        self._seen = (0, 0, 0, 0)   # engine counters already counted: preemptions, hits, queries, loop bans
        self._seen_spec: tuple = (0, 0, 0, ())   # drafts, draft tokens, accepted, accepted per position

    def add_tenants(self, names) -> None:
        """The per-tenant series of every tenant the keys file names (and `anonymous`) exist from start-up, at 0."""
        for name in names:
            for counter in (self.tenant_prompt_tokens, self.tenant_cached_tokens, self.tenant_generation_tokens,
                            self.tenant_ttft, self.tenant_busy):
                self.labels(counter, name)
            for reason in ("stop", "length", "abort"):
                self.labels(self.tenant_requests, name, reason)

    def labels(self, metric, *values):
        """The child of `metric` for this model (and `values`), looked up once: prometheus_client's own lookup
        costs microseconds, and several run per token."""
        key = (id(metric), values)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(self.model_name, *values)
        return child

    def observe_stats(self, stats: EngineStats, step_seconds: float | None,
                      tenant_tokens: dict[str, int] | None = None) -> None:
        """The core's gauges and counters after a step (`step_seconds` None: no step ran, e.g. after aborts);
        `tenant_tokens`: the tokens the step computed for each tenant ("" anonymous), its time's shares."""
        if step_seconds is not None:
            self.labels(self.step).observe(step_seconds)
            self._observe_moments(stats.step_decodes, stats.step_prefill_tokens, step_seconds)
            if tenant_tokens:
                per_token = step_seconds / sum(tenant_tokens.values())
                for tenant, tokens in tenant_tokens.items():
                    self.labels(self.tenant_busy, tenant or "anonymous").inc(tokens * per_token)
        seen = (stats.num_preemptions, stats.prefix_cache_hits, stats.prefix_cache_queries, stats.structured_loop_bans)
        counters = (self.preemptions, self.prefix_hits, self.prefix_queries, self.loop_bans)
        for counter, new, old in zip(counters, seen, self._seen):
            if new > old:
                self.labels(counter).inc(new - old)
        self._seen = seen
        self._observe_speculation(stats)
        self._observe_experts(stats)
        self.lora.observe(stats.lora_running, stats.lora_waiting)
        self.kv.observe(stats.kv_transfer)
        self.labels(self.running).set(stats.num_running)
        self.labels(self.waiting).set(stats.num_waiting)
        self.labels(self.kv_usage).set(stats.kv_cache_usage)
        if self.vllm is not None:
            self.labels(self.vllm["running"]).set(stats.num_running)
            self.labels(self.vllm["waiting"]).set(stats.num_waiting)
            self.labels(self.vllm["kv_usage"]).set(stats.kv_cache_usage)

    def _observe_moments(self, n: int, p: int, t: float) -> None:
        for moment, value in (("n", n), ("p", p), ("nn", n * n), ("np", n * p), ("pp", p * p), ("nt", n * t),
                              ("pt", p * t)):
            if value:
                self.labels(self.step_moments, moment).inc(value)

    def _observe_experts(self, stats: EngineStats) -> None:
        if not stats.expert_tokens or stats.expert_tokens == self._seen_experts:
            return
        old = self._seen_experts or (0,) * len(stats.expert_tokens)
        for expert, (new, before) in enumerate(zip(stats.expert_tokens, old)):
            child = self.labels(self.expert_tokens, str(expert))
            if new > before:
                child.inc(new - before)
        self._seen_experts = stats.expert_tokens
        self.labels(self.expert_imbalance).set(stats.expert_imbalance)

    def _observe_speculation(self, stats: EngineStats) -> None:
        seen = (stats.spec_num_drafts, stats.spec_num_draft_tokens, stats.spec_num_accepted_tokens,
                stats.spec_accepted_per_position)
        if seen == self._seen_spec:
            return
        for name, new, old in zip(("drafts", "draft_tokens", "accepted"), seen, self._seen_spec):
            if new > old:
                for family in self.spec_families:
                    self.labels(family[name]).inc(new - old)
        old_positions = self._seen_spec[3] or (0,) * len(seen[3])
        for position, (new, old) in enumerate(zip(seen[3], old_positions)):
            if new > old:
                for family in self.spec_families:
                    self.labels(family["per_position"], str(position)).inc(new - old)
        self._seen_spec = seen

    def observe_engine(self, block_size: int, num_blocks: int, speculative_tokens: int = 0,
                       num_gpus: int = 0) -> None:
        """The KV cache's settings and the GPUs, once the engine is up; the per-position acceptance series at 0."""
        self.labels(self.accelerators).set(num_gpus)
        for position in range(speculative_tokens):
            for family in self.spec_families:
                self.labels(family["per_position"], str(position))
        if self.vllm is not None:
            self.labels(self.vllm["cache_config"], str(block_size), str(num_blocks)).set(1)

    def observe_startup(self, phases: dict[str, float]) -> None:
        for phase, seconds in phases.items():
            self.labels(self.startup, phase).set(seconds)

    def record_output(self, output: RequestOutput, now: float) -> None:
        request_id = output.request_id
        if output.new_token_ids:
            self.labels(self.generation_tokens).inc(len(output.new_token_ids))
            self.labels(self.tenant_generation_tokens, output.tenant or "anonymous").inc(len(output.new_token_ids))
            last = self._last_token_time.get(request_id)
            if last is None:   # as the API side sees it: arrival here to the first token here
                self.labels(self.ttft).observe(now - output.arrival_time)
                self.labels(self.prompt_tokens).inc(len(output.prompt_token_ids))
                self.labels(self.request_prompt_tokens).observe(len(output.prompt_token_ids))
                tenant = output.tenant or "anonymous"
                self.labels(self.tenant_ttft, tenant).observe(now - output.arrival_time)
                self.labels(self.tenant_prompt_tokens, tenant).inc(len(output.prompt_token_ids))
                self.labels(self.tenant_cached_tokens, tenant).inc(output.num_cached_tokens)
            else:   # per token: a step that accepted drafts brings several, sharing the interval
                count = len(output.new_token_ids)
                for _ in range(count):
                    self.labels(self.itl).observe((now - last) / count)
            self._last_token_time[request_id] = now
        if output.finished:
            self._last_token_time.pop(request_id, None)
            self.labels(self.e2e).observe(now - output.arrival_time)
            self.labels(self.request_generation_tokens).observe(len(output.token_ids))
            self.labels(self.success, output.finish_reason).inc()
            self.labels(self.tenant_requests, output.tenant or "anonymous", output.finish_reason).inc()

    def set_adapters(self, names) -> None:
        self.lora.set_adapters(names)

    def count_error(self, status: int) -> None:
        self.labels(self.errors, str(status)).inc()
