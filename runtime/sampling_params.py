"""Per-request sampling settings, validated once when built."""
from dataclasses import dataclass, field

from kubeinfer.runtime.errors import InvalidRequestError
from kubeinfer.runtime.structured.spec import StructuredOutput

MAX_LOGPROBS = 20
MAX_SALT = 1024


@dataclass
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 1.0        # 0 = greedy
    top_p: float = 1.0              # in (0, 1]
    top_k: int = -1                 # -1 = off
    min_p: float = 0.0              # in [0, 1]
    repetition_penalty: float = 1.0  # > 0; > 1 discourages tokens of the prompt and the output
    presence_penalty: float = 0.0   # in [-2, 2], OpenAI semantics, over the output
    frequency_penalty: float = 0.0  # in [-2, 2], OpenAI semantics, over the output
    seed: int | None = None         # same seed, same output, whatever else runs in the batch
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    min_tokens: int = 0
    ignore_eos: bool = False
    logprobs: int | None = None     # top-N logprobs of each sampled position (0 = only the sampled token's)
    skip_special_tokens: bool = True
    structured: StructuredOutput | None = None   # the output must match this grammar (response_format, tools)
    logit_bias: dict[int, float] = field(default_factory=dict)   # token id -> added to its logit, in [-100, 100]
    # Whose request it is, for the `fair` scheduling policy (set by the server from the API key, never by a client)
    tenant: str = ""                # "" : anonymous traffic, one tenant
    tenant_weight: float = 1.0      # its share of tokens against other tenants' weights
    priority: int = 0               # strict classes: lower goes first, and may preempt higher ones
    lora_name: str | None = None    # the LoRA adapter the request runs on (docs/lora.md); None: the base model
    # Who may reuse this request's prefix cache blocks (docs/runtime.md, "Prefix cache isolation"): requests of equal
    # scope (set by the server from the tenant and --prefix-cache-sharing; None: everyone) and equal salt
    cache_scope: tuple[str, str] | None = None
    cache_salt: str | None = None   # the client's own (`cache_salt`, as vLLM names it)
    # The W3C traceparent of the request's span on this replica (set by the server when tracing is on): a KV pull
    # carries it to the prefill replica, whose spans join the request's trace
    trace_context: str | None = None

    def __post_init__(self):
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        _check(isinstance(self.max_tokens, int) and self.max_tokens >= 1,
               f"max_tokens must be at least 1, got {self.max_tokens}", "max_tokens")
        _check(self.temperature >= 0, f"temperature must be >= 0, got {self.temperature}", "temperature")
        _check(0 < self.top_p <= 1, f"top_p must be in (0, 1], got {self.top_p}", "top_p")
        _check(self.top_k == -1 or self.top_k >= 1, f"top_k must be -1 (off) or >= 1, got {self.top_k}", "top_k")
        _check(0 <= self.min_p <= 1, f"min_p must be in [0, 1], got {self.min_p}", "min_p")
        _check(self.repetition_penalty > 0,
               f"repetition_penalty must be > 0, got {self.repetition_penalty}", "repetition_penalty")
        _check(-2 <= self.presence_penalty <= 2,
               f"presence_penalty must be in [-2, 2], got {self.presence_penalty}", "presence_penalty")
        _check(-2 <= self.frequency_penalty <= 2,
               f"frequency_penalty must be in [-2, 2], got {self.frequency_penalty}", "frequency_penalty")
        _check(0 <= self.min_tokens <= self.max_tokens,
               f"min_tokens must be in [0, max_tokens], got {self.min_tokens}", "min_tokens")
        _check(all(isinstance(s, str) and s for s in self.stop), "stop strings must be non-empty", "stop")
        _check(self.tenant_weight > 0, f"tenant_weight must be > 0, got {self.tenant_weight}", "tenant_weight")
        _check(self.cache_salt is None or (isinstance(self.cache_salt, str) and 0 < len(self.cache_salt) <= MAX_SALT),
               f"cache_salt must be a non-empty string of at most {MAX_SALT} characters", "cache_salt")
        _check(self.seed is None or -2**63 <= self.seed < 2**64,   # what torch's generators take
               f"seed must be a 64-bit integer, got {self.seed}", "seed")
        _check(self.logprobs is None or 0 <= self.logprobs <= MAX_LOGPROBS,
               f"logprobs must be in [0, {MAX_LOGPROBS}], got {self.logprobs}", "logprobs")
        _check(all(isinstance(t, int) and t >= 0 and -100 <= b <= 100 for t, b in self.logit_bias.items()),
               "logit_bias maps token ids (>= 0) to biases in [-100, 100]", "logit_bias")
        if self.structured is not None:   # the grammar ends the output with EOS: nothing may hold EOS back
            _check(not self.ignore_eos, "ignore_eos cannot be combined with structured output", "ignore_eos")
            _check(self.min_tokens == 0, "min_tokens cannot be combined with structured output", "min_tokens")

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0

    @property
    def has_penalties(self) -> bool:
        return self.repetition_penalty != 1 or self.presence_penalty != 0 or self.frequency_penalty != 0


def _check(ok: bool, message: str, param: str) -> None:
    if not ok:
        raise InvalidRequestError(message, param)
