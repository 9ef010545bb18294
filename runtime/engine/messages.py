"""What crosses between the engine core and the API process: token deltas, the core's stats, its info, and the
check of a prompt against it. Plain data, no torch: the API process imports this and never imports torch
(that import alone is about a second of a pod's start-up, and hundreds of MB of its memory).
"""
from dataclasses import dataclass

from kubeinfer.runtime.errors import InvalidRequestError

SLEEP_LEVELS = (1, 2)   # engine/sleep.py: 1 moves the weights off the device, 2 drops them


@dataclass
class TokenLogprobs:
    token_id: int
    logprob: float
    top: list[tuple[int, float]]   # the N most likely tokens with their logprobs, most likely first


@dataclass
class TokenDelta:
    """What one step did for one sequence: its new token, and whether the sequence ended with it."""
    request_id: str
    token_id: int
    logprobs: TokenLogprobs | None
    finish_reason: str | None        # "stop" or "length" when this token ended the sequence
    stop_reason: int | None          # the stop token id that ended it
    num_cached_tokens: int           # prompt tokens served by the prefix cache
    first_token_time: float         # when the sequence's first token was sampled (monotonic clock)
    scheduled_time: float | None = None   # when it was first scheduled (or its KV pull started)


@dataclass
class EngineStats:
    """The scheduler's gauges now and its counters since start-up (for metrics)."""
    num_running: int
    num_waiting: int
    kv_cache_usage: float
    num_preemptions: int
    prefix_cache_hits: int
    prefix_cache_queries: int
    spec_num_drafts: int = 0                          # speculation: sequence-steps that carried drafts
    spec_num_draft_tokens: int = 0
    spec_num_accepted_tokens: int = 0
    spec_accepted_per_position: tuple[int, ...] = ()  # accepted drafts by position 0..k-1
    expert_tokens: tuple[int, ...] = ()               # MoE: tokens routed to each expert, summed over layers
    expert_imbalance: float = 0.0                     # MoE: the worst layer's busiest expert over its mean
    lora_running: dict[str, int] | None = None        # LoRA: running requests per adapter
    lora_waiting: dict[str, int] | None = None        # LoRA: waiting requests per adapter
    step_decodes: int = 0                             # the last step: sequences decoding (one token, or drafts)
    step_prefill_tokens: int = 0                      # the last step: prompt tokens computed
    kv_transfer: dict[str, int] | None = None         # a KV role's counters (`kv_transfer_counts`), else None


@dataclass
class EngineInfo:
    """What the API side needs to know of the core once it is up."""
    max_model_len: int
    num_blocks: int
    block_size: int
    vocab_size: int
    eos_token_ids: tuple[int, ...]
    startup_phases: dict[str, float]
    speculative_tokens: int = 0     # draft tokens per step at most (0: speculation off)
    loras: dict[str, str] | None = None   # LoRA adapters loaded at start (--lora-modules), name -> folder
    num_gpus: int = 0               # GPUs the engine computes on (one per process); 0 on CPU
    kv_role: str | None = None      # disaggregated serving: prefill | decode (None: neither)
    kv_address: str | None = None   # prefill: its KV endpoint, host:port as it listens


def check_token_ids(params, info: EngineInfo) -> None:
    """Refuses token ids in a request's settings (`logit_bias`, `stop_token_ids`) outside the vocabulary."""
    for name, ids in (("logit_bias", params.logit_bias), ("stop_token_ids", params.stop_token_ids)):
        if any(not 0 <= t < info.vocab_size for t in ids):
            raise InvalidRequestError(f"{name} token ids must be in [0, {info.vocab_size})", name)


def check_prompt(token_ids: list[int], info: EngineInfo) -> None:
    """Refuses a prompt the engine cannot serve, with the reason in the user's terms."""
    if not token_ids:
        raise InvalidRequestError("the prompt is empty", "prompt")
    if len(token_ids) >= info.max_model_len:
        raise InvalidRequestError(f"the prompt has {len(token_ids)} tokens; this model serves at most "
                                  f"{info.max_model_len} tokens in all (prompt and output)", "prompt")
    if min(token_ids) < 0 or max(token_ids) >= info.vocab_size:
        raise InvalidRequestError(f"prompt token ids must be in [0, {info.vocab_size})", "prompt")


def check_resumed_output(prompt: list[int], output_token_ids: list[int], params, info: EngineInfo) -> None:
    """Refuses a resumed request's output so far (`kubeinfer_resume`) that the request could not have produced."""
    if len(output_token_ids) >= params.max_tokens:
        raise InvalidRequestError(f"the resumed output has {len(output_token_ids)} tokens, max_tokens is "
                                  f"{params.max_tokens}: nothing is left to generate", "kubeinfer_resume")
    if len(prompt) + len(output_token_ids) >= info.max_model_len:
        raise InvalidRequestError(f"the prompt and the resumed output have {len(prompt) + len(output_token_ids)} "
                                  f"tokens; this model serves at most {info.max_model_len}", "kubeinfer_resume")
    if output_token_ids and (min(output_token_ids) < 0 or max(output_token_ids) >= info.vocab_size):
        raise InvalidRequestError(f"resumed token ids must be in [0, {info.vocab_size})", "kubeinfer_resume")
