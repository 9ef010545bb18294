"""What crosses between the engine core and the API process: the messages each side sends the other (the contract of
`engine/core_loop.py` and `server/engine_client.py`), what they carry (token deltas, the core's stats, its info), and
the check of a prompt against that info. Plain data, no torch: the API process imports this and never imports torch
(that import alone is about a second of a pod's start-up, and hundreds of MB of its memory).

To the engine: AddRequest or AddRemoteRequest, AbortRequests, StopRequest, StepsRead, LoraOperation, PutToSleep, WakeUp,
Shutdown. From it: Ready once, then StepOutput per step, Rejected, LoraDone, Slept, Woke, TransferFailed,
RequestFailed, and EngineFailed when it dies (or cannot start). A control message (LoraOperation, PutToSleep, WakeUp)
carries a number its answer (LoraDone, Slept, Woke) repeats. Messages are frozen, slotted dataclasses: a StepOutput
is pickled through the pipe every step (process mode), so they carry no more than their fields.
"""
from dataclasses import dataclass

from kubeinfer.runtime.errors import InvalidRequestError
from kubeinfer.runtime.sampling_params import SamplingParams

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
    structured_loop_bans: int = 0                     # tokens structured output's loop guard banned, since start


@dataclass
class EngineInfo:
    """What the API side needs to know of the core once it is up."""
    max_model_len: int              # the longest sequence served: the config's, or less where the KV cache holds less
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


# -- to the engine ----------------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class AddRequest:
    request_id: str
    token_ids: list[int]              # the prompt
    params: SamplingParams
    arrival_time: float               # when the API process got it (monotonic clock)
    resumed_token_ids: list[int]      # a resumed request's output so far (`kubeinfer_resume`), else empty


@dataclass(frozen=True, slots=True)
class AddRemoteRequest:
    """A decode replica's request whose prompt KV and first token are pulled from a prefill replica."""
    request_id: str
    token_ids: list[int]
    params: SamplingParams
    arrival_time: float
    kv_source: str                    # the prefill replica's KV endpoint, host:port


@dataclass(frozen=True, slots=True)
class AbortRequests:
    request_ids: list[str]


@dataclass(frozen=True, slots=True)
class StopRequest:
    """The API side found a stop string in the request's text (the core sees tokens only)."""
    request_id: str
    stop: str                         # the stop string found


@dataclass(frozen=True, slots=True)
class StepsRead:
    """The API side has read this many StepOutputs: the core may run that many steps ahead again."""
    num_steps: int


@dataclass(frozen=True, slots=True)
class LoraOperation:
    number: int                       # the API side's number for this message, repeated in its answer (LoraDone)
    operation: str                    # "load" or "unload"
    name: str
    path: str | None                  # the adapter's folder (load only)


@dataclass(frozen=True, slots=True)
class PutToSleep:
    """Sleep once no request is unfinished (engine/sleep.py); a WakeUp before then cancels it."""
    number: int
    level: int                        # one of SLEEP_LEVELS


@dataclass(frozen=True, slots=True)
class WakeUp:
    """Wake now (nothing to do if awake), cancelling the sleeps still waiting."""
    number: int


@dataclass(frozen=True, slots=True)
class Shutdown:
    """Stop serving: the API process has drained its requests, or is going away."""


# -- from the engine --------------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Ready:
    info: EngineInfo


@dataclass(frozen=True, slots=True)
class StepOutput:
    deltas: list[TokenDelta]
    stats: EngineStats
    seconds: float | None             # the step's time; None: no step ran (the gauges after aborts or stops)
    tenant_tokens: dict[str, int]     # tokens the step computed, by tenant ("" anonymous)


@dataclass(frozen=True, slots=True)
class Rejected:
    """An add the core refused (InvalidRequestError, sent on as the API's 400)."""
    request_id: str
    message: str


@dataclass(frozen=True, slots=True)
class LoraDone:
    number: int
    error: str | None                 # what went wrong (the API's 400), else None


@dataclass(frozen=True, slots=True)
class Slept:
    number: int
    error: str | None                 # why the engine does not sleep (a WakeUp cancelled it, a bad level), else None
    figures: dict | None              # the level it sleeps at, the seconds it took, the bytes freed (core.sleep)


@dataclass(frozen=True, slots=True)
class Woke:
    number: int | None                # None: a request woke it
    figures: dict                     # the level it woke from (0: it was awake), the seconds it took


@dataclass(frozen=True, slots=True)
class TransferFailed:
    """A decode replica's KV pull failed (sent after the step that found it): the request ended, a 502."""
    request_id: str
    message: str


@dataclass(frozen=True, slots=True)
class RequestFailed:
    """The engine ended the request with an error after a step (an adapter it could not read): a 500."""
    request_id: str
    message: str


@dataclass(frozen=True, slots=True)
class EngineFailed:
    """The engine could not start, or died; the last message it sends."""
    message: str


ToEngine = (AddRequest | AddRemoteRequest | AbortRequests | StopRequest | StepsRead | LoraOperation | PutToSleep
            | WakeUp | Shutdown)
FromEngine = (Ready | StepOutput | Rejected | LoraDone | Slept | Woke | TransferFailed | RequestFailed
              | EngineFailed)


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
