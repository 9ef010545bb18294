"""Admission of `/v1/completions`, `/v1/chat/completions` and `/v1/responses` requests: the server's state, the
API key, and the checks and room reservation that come before anything reaches the engine (`admit`).

Admission, in order: API key (401), draining (503), model name (404), request shape and sampling values (400), room
in the waiting queue (429), the key's token quota (429). Room is reserved in the same event-loop turn as the check,
and given back when the response ends (`Job.release`).
"""
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

from fastapi import Request

from kubeinfer.runtime.config import EngineConfig
from kubeinfer.runtime.disagg.source_signature import verify as verify_source
from kubeinfer.runtime.errors import InvalidRequestError
from kubeinfer.runtime.sampling_params import SamplingParams
from kubeinfer.runtime.engine.messages import check_prompt, check_resumed_output, check_token_ids
from kubeinfer.runtime.server.engine_client import EngineClient
from kubeinfer.runtime.server.auth import KeyRing, Tenant
from kubeinfer.runtime.server.checked_answers import checked_outputs, resampled
from kubeinfer.runtime.server import lora_api
from kubeinfer.runtime.server.errors import APIError
from kubeinfer.runtime.server.kv_source import after, check_kv_source
from kubeinfer.runtime.server.metrics import EngineMetrics
from kubeinfer.runtime.server.protocol import Resume
from kubeinfer.runtime.server.responses_store import ResponseStore
from kubeinfer.runtime.server.trusted_header import TrustedTenantHeader, tenant_for
from kubeinfer.runtime.structured.spec import StructuredOutput
from kubeinfer.runtime.tokenizer import Tokenizer

if TYPE_CHECKING:
    from kubeinfer.runtime.server.lora_file import LoraFile

RETRY_AFTER_FULL_SECONDS = 1.0


@dataclass
class ServerState:
    engine: EngineClient
    tokenizer: Tokenizer
    config: EngineConfig
    keys: KeyRing
    metrics: EngineMetrics
    draining: bool = False
    admitted: int = 0   # engine requests of admitted jobs whose responses have not ended
    responses: ResponseStore = field(default_factory=ResponseStore)   # /v1/responses with store: true
    loras: dict[str, str] = field(default_factory=dict)   # LoRA adapters served: name -> folder (lora_api.py)
    lora_file: "LoraFile | None" = None   # --lora-modules-file, watched (lora_file.py)
    trusted_header: TrustedTenantHeader = field(default_factory=lambda: TrustedTenantHeader(None))
    kv_source_key: bytes | None = None   # --kv-source-key-file: KV-source hints must carry the router's signature

    @property
    def capacity(self) -> int:
        """Requests the engine may hold: the running batch plus the bounded waiting queue."""
        return self.config.max_num_seqs + self.config.max_waiting_requests


@dataclass
class Job:
    request_id: str
    prompts: list[list[int]]
    params: list[SamplingParams]   # one per (prompt, choice), in choice-index order
    n: int
    key: str | None
    state: ServerState | None = None   # holds the job's room until `release`
    resume: Resume | None = None       # a continuation of a stream whose replica died
    kv_source: str | None = None       # a decode replica: the prefill replica's KV endpoint (kv_source.py)
    primed: dict = field(default_factory=dict)   # sub-request id -> (first output, the rest), started (kv_source.py)
    trace: object = None               # its spans (request_trace.RequestTrace) when tracing is on

    def release(self) -> None:
        """Gives the job's room back (once, whichever path ends the response first)."""
        if self.state is not None:
            self.state.admitted -= len(self.params)
            self.state = None

    def sub_requests(self):
        for index, params in enumerate(self.params):
            yield index, f"{self.request_id}-{index}", self.prompts[index // self.n], params

    def outputs(self, engine: EngineClient, sub_id: str, prompt: list[int], params: SamplingParams):
        """A sub-request's outputs: started already (a pulled request's, `start_pulled`), or started now; a
        constrained answer is checked against its schema, a held one that fails drawn again (`checked_answers`)."""
        primed = self.primed.pop(sub_id, None)
        outputs = after(*primed) if primed is not None else engine.generate(sub_id, prompt, params, self.resume)
        if params.structured is None:
            return outputs

        def again(attempt: int):   # a held answer that failed its check, drawn anew (the client saw none of it)
            if self.state is not None:
                self.state.metrics.labels(self.state.metrics.structured_resamples).inc()
            return engine.generate(f"{sub_id}-again{attempt}", prompt, resampled(params, attempt))

        def discarded(tokens: int):   # an answer thrown away was computed all the same: the key pays for it
            if self.state is not None:
                self.state.keys.charge(self.key, tokens)
        return checked_outputs(outputs, params.structured, None if params.is_greedy else again, discarded=discarded)

    async def close_primed(self) -> None:
        """Ends the started requests nobody read (a stream whose body never started): aborted, their blocks freed."""
        for _, rest in self.primed.values():
            await rest.aclose()
        self.primed.clear()

    @property
    def num_prompt_tokens(self) -> int:
        return sum(map(len, self.prompts))


class Caller(NamedTuple):
    """Who sent a request: its API key (None: keys off) and its tenant (the key's, or a trusted gateway's header's)."""
    key: str | None
    tenant: Tenant


def authenticate(state: ServerState, request: Request) -> Caller:
    key = None
    if state.keys.enabled:
        key = state.keys.authenticate(request.headers.get("authorization"))
        if key is None:
            raise APIError(401, "missing or invalid API key; send 'Authorization: Bearer <key>'",
                           code="invalid_api_key")
    peer = request.client.host if request.client is not None else None
    named = state.trusted_header.named(request.headers.raw, peer)
    return Caller(key, tenant_for(state.keys, key, named))


def admit(state: ServerState, body, caller: Caller, prompts: list[list[int]], max_tokens: int | None,
          logprobs: int | None, prefix: str, structured: StructuredOutput | None = None) -> Job:
    """Checks and reserves room for a request; `structured`: the tools' grammar, else the body's own format."""
    if state.draining:
        raise APIError(503, "the server is shutting down", code="draining")
    lora_name = lora_api.adapter_of(state, body.model)   # None: the base model; 404 for a name not served
    structured = structured or body.structured_output(state.config.json_layout)
    max_len = state.engine.info.max_model_len
    params = []
    for prompt in prompts:
        check_prompt(prompt, state.engine.info)
        wanted = max_len - len(prompt) if max_tokens is None else max_tokens
        if len(prompt) + wanted > max_len:
            raise InvalidRequestError(f"max_tokens {wanted} plus the prompt's {len(prompt)} tokens exceeds this "
                                      f"model's {max_len}-token limit", "max_tokens")
        params.extend(body.sampling_params(wanted, logprobs, choice, structured) for choice in range(body.n))
        check_token_ids(params[-1], state.engine.info)
    key, tenant = caller   # from the key, or a trusted gateway's header: a client never names its own tenant
    scope = tenant.cache_scope(state.config.prefix_cache_sharing)
    for choice in params:
        choice.tenant, choice.tenant_weight, choice.priority = tenant.name, tenant.weight, tenant.priority
        choice.lora_name, choice.cache_scope = lora_name, scope
    if state.admitted + len(params) > state.capacity:
        raise APIError(429, "the server is at capacity; retry later", code="queue_full",
                       retry_after=RETRY_AFTER_FULL_SECONDS)
    resume = body.kubeinfer_resume
    if resume is not None:
        if not body.stream or len(params) != 1:
            raise InvalidRequestError("kubeinfer_resume continues a stream of one choice: stream true, n 1, "
                                      "one prompt", "kubeinfer_resume")
        check_resumed_output(prompts[0], resume.token_ids, params[0], state.engine.info)
    kv_source = getattr(body, "kubeinfer_kv_source", None)
    if kv_source is not None:
        check_kv_source(state.config, kv_source, params, resume is not None)
        if state.kv_source_key is not None:
            verify_source(state.kv_source_key, kv_source, getattr(body, "kubeinfer_kv_source_signature", None))
    job = Job(f"{prefix}-{uuid.uuid4().hex}", prompts, params, body.n, key, resume=resume, kv_source=kv_source)
    wait = state.keys.retry_after(key, job.num_prompt_tokens)
    if wait is not None:
        raise APIError(429, f"token quota of {state.keys.limit(key)} tokens per minute exceeded",
                       code="quota_exceeded", retry_after=wait)
    state.keys.charge(key, job.num_prompt_tokens)
    state.admitted += len(params)   # no await since the check: nothing else was admitted in between
    job.state = state
    return job
