"""The engine core: token ids in, token ids out, one scheduler step at a time. Owns the device.

`step()` = `scheduler.schedule()` -> `model_runner.run()` -> `scheduler.postprocess()`; it returns one
`TokenDelta` per new token (a sequence gets several in a step where its draft tokens were accepted). Text (detokenization, stop strings) is the output processor's
job, so the core can run in a process of its own and send one small message per step (see
`kubeinfer.runtime.server.engine_client`); `LLMEngine` puts both together in one process for offline use.
"""
import logging
import threading
import time
from collections import Counter

from kubeinfer.runtime.config import EngineConfig
from kubeinfer.runtime.engine import sleep as engine_sleep
from kubeinfer.runtime.engine.block_manager import BlockManager
from kubeinfer.runtime.engine.messages import (EngineInfo, EngineStats, TokenDelta, check_prompt, check_resumed_output,
                                               check_token_ids)
from kubeinfer.runtime.engine.model_runner import ModelRunner
from kubeinfer.runtime.engine.scheduler import Scheduler
from kubeinfer.runtime.engine.scheduler_stats import TenantTokens
from kubeinfer.runtime.engine.sequence import Sequence, SequenceStatus
from kubeinfer.runtime.errors import InvalidRequestError
from kubeinfer.runtime.layers.fused_moe import expert_load_summary
from kubeinfer.runtime.lora.adapter import LoraError
from kubeinfer.runtime.sampling_params import SamplingParams
from kubeinfer.runtime.structured.grammars import GrammarCache

logger = logging.getLogger(__name__)
EXPERT_LOAD_INTERVAL_S = 1.0
TRANSFER_POLL_S = 0.01   # the longest an idle step waits for a KV transfer to move (any progress wakes it sooner)


def step_composition(batch) -> tuple[int, int]:
    """(sequences decoding one token, with their drafts if any; prompt tokens prefilled) of a scheduled batch: what
    the step's time is fitted against (kubeinfer_engine_step_moments_total)."""
    decodes, prefill = batch.num_decodes, 0   # the bulk decodes come first: one token each, no drafts
    for seq, num_new in zip(batch.seqs[decodes:], batch.num_new_tokens[decodes:]):
        if num_new - len(seq.draft_token_ids) <= 1:
            decodes += 1
        else:
            prefill += num_new
    return decodes, prefill


class EngineCore:
    def __init__(self, config: EngineConfig, eos_token_ids: tuple[int, ...]):
        self.config = config
        self.model_runner = runner = ModelRunner(config)   # its max_model_len: at most what the KV cache holds
        self.block_manager = BlockManager(runner.num_blocks, config.block_size, config.max_num_seqs,
                                          runner.max_blocks_per_seq, config.enable_prefix_caching)
        self.scheduler = Scheduler(config, self.block_manager, eos_token_ids, runner.max_model_len)
        if self.model_runner.lora is not None:   # rank 0 reads an adapter before it takes a slot (slot_table)
            self.scheduler.loras.prepare = self.model_runner.lora.read
        self.failures: list[tuple[str, str]] = []   # (request id, why): ended by the engine with an error
        self.seqs: dict[str, Sequence] = {}
        self.tenant_tokens = TenantTokens()
        self.step_tenant_tokens: dict[str, int] = {}   # tokens the last step computed, by tenant ("" anonymous)
        self.grammars = GrammarCache(config.model, config.model_config.vocab_size, eos_token_ids)
        self._expert_load_read: tuple[float, tuple] | None = None   # (when, figures) of the last MoE load read
        self.last_step: tuple[int, int] = (0, 0)   # the last step's decoding sequences and prefill tokens
        self.lora_paths: dict[str, str] = {}   # adapters requests may name (docs/lora.md)
        self.lora_ids: dict[str, str] = {}     # their content digests (the prefix cache's key, block_manager)
        for name, path in config.lora_modules.items():   # a bad one is logged and left out; the others serve
            try:
                self.load_lora(name, path)
            except LoraError as error:
                logger.error("LoRA adapter %s not loaded at start: %s", name, error)
        self.info = EngineInfo(runner.max_model_len, self.block_manager.num_blocks, config.block_size,
                               config.model_config.vocab_size, eos_token_ids,
                               dict(self.model_runner.startup_phases),
                               config.speculative_tokens if config.speculative_method else 0, dict(self.lora_paths),
                               config.world_size if runner.device.type == "cuda" else 0)
        self.sleeping: engine_sleep.Sleep | None = None
        self.request_wakes: list[dict] = []   # wake-ups requests caused, taken by the serving loop
        self.transfer_progress = threading.Event()
        self.kv_exporter = self.kv_importer = None
        if config.kv_role is not None:
            from kubeinfer.runtime.disagg.roles import start_kv_role
            start_kv_role(self, config)
            self.info.kv_role = config.kv_role
            if self.kv_exporter is not None:
                self.info.kv_address = self.kv_exporter.source.address

    @property
    def idle_wait_s(self) -> float | None:
        """How long the serving loop may block with nothing to run: a prefill replica polls for pulls."""
        return TRANSFER_POLL_S if self.kv_exporter is not None else None

    def add(self, request_id: str, token_ids: list[int], params: SamplingParams,
            arrival_time: float | None = None, output_token_ids: list[int] = ()) -> None:
        """`output_token_ids`: a resumed request's output so far (see `Sequence`). A sleeping engine wakes first."""
        self._wake_for_request()
        if request_id in self.seqs:
            raise InvalidRequestError(f"request id {request_id!r} is already in use")
        check_prompt(token_ids, self.info)
        check_token_ids(params, self.info)
        if output_token_ids:
            check_resumed_output(token_ids, output_token_ids, params, self.info)
        seq = Sequence(request_id, token_ids, params, arrival_time, output_token_ids)
        if params.lora_name is not None:
            seq.lora_path = self.lora_paths.get(params.lora_name)
            if seq.lora_path is None:
                raise InvalidRequestError(f"no LoRA adapter {params.lora_name!r} is loaded", "model")
            seq.lora_id = self.lora_ids[params.lora_name]
        if params.structured is not None:
            seq.guide = self.grammars.matcher(params.structured.grammar)
            seq.string_scan, seq.key_scan = self.grammars.guard_scans()
            if output_token_ids and not seq.guide.consume_tokens(list(output_token_ids)):
                raise InvalidRequestError("the resumed output does not follow the request's grammar")
        self.seqs[request_id] = seq
        self.scheduler.add(seq)

    def add_remote(self, request_id: str, token_ids: list[int], params: SamplingParams, source: str,
                   arrival_time: float | None = None) -> None:
        """A request whose prompt's KV and first token come from the prefill replica at `source` (`host:port`)."""
        if self.kv_importer is None:
            raise InvalidRequestError("this replica pulls no KV: start it with kv_role decode")
        self._wake_for_request()
        if request_id in self.seqs:
            raise InvalidRequestError(f"request id {request_id!r} is already in use")
        check_prompt(token_ids, self.info)
        check_token_ids(params, self.info)
        seq = Sequence(request_id, token_ids, params, arrival_time)
        self.kv_importer.add(seq, source)
        self.seqs[request_id] = seq

    def load_lora(self, name: str, path: str) -> None:
        """Checks the adapter at `path` against the model and serves it as `name` (a no-op when it already is)."""
        if self.model_runner.lora is None:
            raise LoraError("LoRA adapters are off on this server: start it with --max-loras N")
        if self.lora_paths.get(name, path) != path:
            raise LoraError(f"adapter {name!r} is already loaded from {self.lora_paths[name]}: unload it first")
        self.lora_ids[name] = self.model_runner.lora.read(name, path).digest
        self.lora_paths[name] = path
        logger.info("LoRA adapter %s loaded from %s", name, path)

    def unload_lora(self, name: str) -> bool:
        """Stops serving `name` to new requests (running ones finish on it); False if it was not loaded."""
        if self.lora_paths.pop(name, None) is None:
            return False
        del self.lora_ids[name]
        if not any(seq.params.lora_name == name for seq in self.seqs.values()):   # else kept for them (its folder
            self.model_runner.lora.forget(name)                                  # may be gone once unloaded)
        logger.info("LoRA adapter %s unloaded", name)
        return True

    def sleep(self, level: int) -> dict:
        """Frees the KV cache and moves (level 1) or drops (level 2) the weights (engine/sleep.py); an idle engine
        only. Returns the level it sleeps at, the seconds it took and the bytes it freed."""
        engine_sleep.check_level(level)
        if self.has_unfinished():
            raise InvalidRequestError("the engine has requests in flight: it sleeps once they have finished", "level")
        started, was_awake = time.monotonic(), self.sleeping is None
        self.sleeping = engine_sleep.sleep_at(self.model_runner, self.sleeping, level)
        if was_awake:
            self.block_manager.forget_cached()   # the pool's contents are gone
        done = {"level": self.sleeping.level, "seconds": time.monotonic() - started,
                "freed_bytes": self.sleeping.freed_bytes}
        logger.info("asleep: %s", done)
        return done

    def wake_up(self) -> dict:
        """Gives a sleeping engine its weights and KV cache back; the level it woke from (0: it was awake) and the
        seconds it took."""
        started, sleeping = time.monotonic(), self.sleeping
        if sleeping is not None:
            engine_sleep.wake(self.model_runner, sleeping)
            self.sleeping = None
            logger.info("awake from level %d in %.2f s", sleeping.level, time.monotonic() - started)
        return {"level": sleeping.level if sleeping else 0, "seconds": time.monotonic() - started}

    def _wake_for_request(self) -> None:
        if self.sleeping is not None:
            self.request_wakes.append(self.wake_up())

    def finish(self, request_id: str, reason: str, stop_reason: str | int | None = None) -> bool:
        """Ends a request from outside a step (an abort, a stop string); False if it had already ended."""
        seq = self.seqs.pop(request_id, None)
        if seq is None:
            return False
        if stop_reason is not None:
            seq.stop_reason = stop_reason
        if seq.status is SequenceStatus.RECEIVING:
            seq.finish_reason = reason
            self.kv_importer.cancel(seq)
            return True
        self.scheduler.finish([seq], reason)
        return True

    def take_failures(self) -> list[tuple[str, str]]:
        """Requests the engine ended with an error since the last call (an adapter it could not read)."""
        failures, self.failures = self.failures, []
        return failures

    def has_unfinished(self) -> bool:
        return bool(self.seqs) or any(role is not None and role.busy for role in (self.kv_exporter, self.kv_importer))

    def step(self) -> list[TokenDelta]:
        self.transfer_progress.clear()
        received = self.kv_importer.admit() if self.kv_importer is not None else []
        if self.kv_exporter is not None:
            self.kv_exporter.take_pulls()
        batch = self.scheduler.schedule()
        for seq, why in self.scheduler.take_failed():
            self.seqs.pop(seq.request_id, None)
            self.failures.append((seq.request_id, why))
            logger.error("request %s ended: %s", seq.request_id, why)
        self.last_step = (0, 0)
        self.step_tenant_tokens = self.tenant_tokens.count(batch)
        if not batch.seqs:
            if self.kv_exporter is not None:
                self.kv_exporter.pump()
            if not received and self.has_unfinished():   # only transfers in flight: wait for one to move
                self.transfer_progress.wait(TRANSFER_POLL_S)
            return received
        if self.kv_exporter is not None:
            self.kv_exporter.hold(batch)
        if self.model_runner.draft is not None:
            self.model_runner.draft.propose(batch, self.block_manager)
        self.last_step = step_composition(batch)
        started = time.perf_counter()
        sampled, logprobs = self.model_runner.run(batch, self.block_manager)
        self.scheduler.observe_step(batch.num_tokens, time.perf_counter() - started)
        kept = self.scheduler.postprocess(batch, sampled)
        self._advance_grammars(batch.seqs, kept)
        now = time.monotonic()
        deltas = received
        exporter = self.kv_exporter
        for seq, tokens, token_logprobs in zip(batch.seqs, kept, logprobs):
            if not tokens:
                continue
            if exporter is not None and exporter.owns(seq.request_id):   # a pull's first token goes on the wire
                if seq.is_finished:
                    del self.seqs[seq.request_id]
                continue
            if seq.first_token_time is None:
                seq.first_token_time = now
            for position, (token, lp) in enumerate(zip(tokens, token_logprobs), 1):
                last = position == len(tokens)   # only the last token of a step can end the sequence
                deltas.append(TokenDelta(seq.request_id, token, lp, seq.finish_reason if last else None,
                                         seq.stop_reason if last and seq.is_finished else None,
                                         seq.num_cached_tokens, seq.first_token_time, seq.scheduled_time))
            if seq.is_finished:
                del self.seqs[seq.request_id]
        if exporter is not None:
            exporter.pump()
        return deltas

    @staticmethod
    def _advance_grammars(seqs: list[Sequence], kept: list[list[int]]) -> None:
        """Moves each constrained sequence's matcher over the tokens it kept. Only kept tokens move it (drafts were
        rolled back), and a preempted sequence keeps its tokens (recomputed, not resampled): its matcher stays right."""
        for seq, tokens in zip(seqs, kept):
            if seq.guide is None or not tokens or seq.is_finished:
                continue
            if not seq.guide.consume_tokens(tokens):
                logger.error("request %s: its grammar refused a sampled token (%s)", seq.request_id,
                             seq.guide.get_error())

    def stats(self, fresh: bool = False) -> EngineStats:
        """The scheduler's figures and the MoE load; `fresh` reads the load now, however recent the last read (the
        engine does before it goes idle, so that the exported counts do not stay a second behind)."""
        scheduler = self.scheduler
        stats = scheduler.stats
        return EngineStats(len(scheduler.running), len(scheduler.waiting), self.block_manager.usage,
                           stats.num_preemptions, stats.prefix_cache_hits, stats.prefix_cache_queries,
                           stats.num_drafts, stats.num_draft_tokens, stats.num_accepted_tokens,
                           tuple(stats.accepted_per_position), *self._expert_load(fresh), *self._lora_load(),
                           *self.last_step, self._kv_transfer_counts(), self.model_runner.sampler.loop_bans)

    def _kv_transfer_counts(self) -> dict[str, int] | None:
        """The KV role's counters since start, and the transfers in flight (docs/server.md, kubeinfer_kv_transfer_*)."""
        role = self.kv_importer or self.kv_exporter
        return None if role is None else role.counts()

    def _lora_load(self) -> tuple[dict[str, int], dict[str, int]]:
        """Running and waiting requests per adapter (empty with LoRA off)."""
        if self.model_runner.lora is None:
            return {}, {}
        waiting = Counter(seq.params.lora_name for seq in self.seqs.values()
                          if seq.lora_slot is None and seq.params.lora_name is not None)
        return self.scheduler.loras.in_use(), dict(waiting)

    def _expert_load(self, fresh: bool) -> tuple[tuple[int, ...], float]:
        """The MoE load figures, read from the device at most once a second unless `fresh` (a read waits for the
        step)."""
        now = time.monotonic()
        last = self._expert_load_read
        if not fresh and last is not None and now - last[0] < EXPERT_LOAD_INTERVAL_S:
            return last[1]
        per_layer = self.model_runner.expert_load()
        summary = expert_load_summary(per_layer) if per_layer else ((), 0.0)
        self._expert_load_read = (now, summary)
        return summary

    def shutdown(self) -> None:
        """Stops the other tensor-parallel ranks, if any. Idempotent."""
        self.model_runner.shutdown()
