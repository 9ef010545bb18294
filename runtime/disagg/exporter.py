"""The prefill role, engine side: every pull becomes a request of the engine whose prompt blocks are held and sent,
in order, as its chunks are computed, followed by its first token.

Runs on the engine's thread at the step's boundaries (`EngineCore.step`):
- `take_pulls()` before scheduling: pulls that arrived become requests sampling one token. A prompt prefix already
  in this replica's prefix cache is not recomputed (the scheduler admits it after its hits, as any request).
- `hold(batch)` after scheduling: the request's blocks are retained, so they outlive the request (it ends when its
  first token is sampled) until they are sent; with backpressure they wait in the cache, not in host memory.
- `pump()` after the step: sends the blocks that are computed, as far as the stream has room; gives back the sent
  ones; then the first token. A transfer the decode side dropped aborts its request and frees its blocks.
"""
import itertools
import logging
import queue
import threading
import time
from dataclasses import dataclass, field

from kubeinfer.runtime.disagg.connector import ExportStream, KVSource, PullRequest
from kubeinfer.runtime.disagg.export_trace import trace_export
from kubeinfer.runtime.engine.sequence import Sequence
from kubeinfer.runtime.errors import InvalidRequestError
from kubeinfer.runtime.sampling_params import SamplingParams

logger = logging.getLogger(__name__)
FIRST_TOKEN_SETTINGS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "presence_penalty",
                        "frequency_penalty", "seed", "min_tokens", "ignore_eos", "stop_token_ids", "logit_bias")


def first_token_settings(params: SamplingParams) -> dict:
    """What the prefill side needs to sample a request's first token as the decode side would."""
    settings = {name: getattr(params, name) for name in FIRST_TOKEN_SETTINGS}
    settings["logit_bias"] = {str(token): bias for token, bias in params.logit_bias.items()}
    return settings


def first_token_params(settings: dict) -> SamplingParams:
    settings = {name: settings[name] for name in FIRST_TOKEN_SETTINGS if name in settings}
    settings["logit_bias"] = {int(token): bias for token, bias in settings.get("logit_bias", {}).items()}
    return SamplingParams(**dict(settings, min_tokens=min(settings.get("min_tokens", 0), 1), max_tokens=1))


@dataclass
class Export:
    request_id: str
    seq: Sequence
    stream: ExportStream
    first_index: int                                       # the blocks below it the decode side holds already
    num_blocks: int                                        # the prompt's
    next_index: int = 0                                    # the next block to hand to the stream
    held: dict[int, int] = field(default_factory=dict)     # block index -> block id, retained here
    finished: bool = False                                 # the first token is handed to the stream
    ending: str | None = None                              # why it ends early
    traceparent: str | None = None                         # the pulling request's span (its trace gets this one's)
    first_token_at: float | None = None                    # when the first token went to the stream (monotonic)


class KVExporter:
    def __init__(self, core, source: KVSource, progress: threading.Event):
        self.core = core
        self.source = source
        self.block_manager = core.block_manager
        self.exports: dict[str, Export] = {}
        self.pulls: queue.SimpleQueue = queue.SimpleQueue()
        self.progress = progress
        self._ids = itertools.count()
        self.num_failed = 0
        self.num_exported = 0       # transfers whose first token went out (each counted once: exported or failed)
        self.num_blocks_sent = 0    # blocks handed to a stream
        source.start(self._on_pull, self.progress.set)

    def counts(self) -> dict[str, int]:
        return {"completed": self.num_exported, "failed": self.num_failed, "blocks_sent": self.num_blocks_sent,
                "in_flight": len(self.exports)}

    @property
    def busy(self) -> bool:
        return bool(self.exports) or not self.pulls.empty()

    def owns(self, request_id: str) -> bool:
        return request_id in self.exports

    def _on_pull(self, request: PullRequest, stream: ExportStream) -> None:   # a transport thread
        self.pulls.put((request, stream))
        self.progress.set()

    def take_pulls(self) -> None:
        size = self.block_manager.block_size
        while not self.pulls.empty():
            request, stream = self.pulls.get()
            request_id = f"kv-export-{next(self._ids)}"
            try:
                if not 0 <= request.num_skip_blocks <= (len(request.token_ids) - 1) // size:
                    raise InvalidRequestError(f"cannot skip {request.num_skip_blocks} blocks of a "
                                              f"{len(request.token_ids)}-token prompt")
                self.core.add(request_id, request.token_ids, first_token_params(request.params))
            except (InvalidRequestError, TypeError, ValueError) as error:   # what a peer sent, refused
                stream.fail(f"the prefill replica refused the prompt: {error}")
                continue
            self.exports[request_id] = Export(request_id, self.core.seqs[request_id], stream,
                                              request.num_skip_blocks, -(-len(request.token_ids) // size),
                                              request.num_skip_blocks, traceparent=request.traceparent)

    def hold(self, batch) -> None:
        """Retains the scheduled exports' blocks not yet handed to their stream (new ones, or those a preempted
        request got anew)."""
        for seq in batch.seqs:
            export = self.exports.get(seq.request_id)
            if export is None:
                continue
            for index in range(export.next_index, min(len(seq.block_table), export.num_blocks)):
                block = seq.block_table[index]
                if export.held.get(index) != block:
                    if index in export.held:
                        self.block_manager.release(export.held[index])
                    self.block_manager.retain(block)
                    export.held[index] = block

    def pump(self) -> None:
        for export in list(self.exports.values()):
            self._pump(export)

    def _pump(self, export: Export) -> None:
        seq, stream = export.seq, export.stream
        if export.ending is None and stream.error is not None:
            export.ending = f"the transfer broke: {stream.error}"
        elif export.ending is None and seq.is_finished and seq.finish_reason not in ("stop", "length"):
            stream.fail(f"the prefill request ended: {seq.finish_reason}")
            export.ending = f"the prefill request ended: {seq.finish_reason}"
        if export.ending is not None:
            self._end(export)
            return
        size = self.block_manager.block_size
        ready = export.num_blocks if seq.is_finished else min(seq.num_computed_tokens, seq.num_prompt_tokens) // size
        while export.next_index < ready and stream.room() > 0:
            stream.send_block(export.next_index, export.held[export.next_index])
            export.next_index += 1
            self.num_blocks_sent += 1
        sent_upto = export.first_index + stream.num_sent
        for index in [index for index in export.held if index < sent_upto]:
            self.block_manager.release(export.held.pop(index))
        if seq.is_finished and export.next_index == export.num_blocks and not export.finished:
            stream.finish(seq.output_token_ids[0])
            export.finished = True
            export.first_token_at = time.monotonic()
            self.num_exported += 1   # taken back in _end if the transport breaks before its last block went out
        if export.finished and not export.held:
            del self.exports[export.request_id]
            _traced(export)

    def _end(self, export: Export) -> None:
        """Aborts the export's request if it still runs; frees its blocks once the transport holds none."""
        if not export.seq.is_finished:
            self.core.finish(export.request_id, "abort")
        if not export.stream.closed:
            return   # the transport may still read them: freed on a later pump (its closing wakes the engine)
        for block in export.held.values():
            self.block_manager.release(block)
        export.held.clear()
        del self.exports[export.request_id]
        if export.finished:   # counted exported when its first token was queued; it never all went out
            self.num_exported -= 1
        self.num_failed += 1
        _traced(export, export.ending)
        logger.info("KV export %s ended early: %s", export.request_id, export.ending)


def _traced(export: Export, error: str | None = None) -> None:
    """The export's spans in the pulling request's trace (export_trace.py), when it carried one."""
    if export.traceparent is not None:
        seq = export.seq
        ended = export.first_token_at or time.monotonic()
        trace_export(export.traceparent, seq.arrival_time, seq.scheduled_time, ended,
                     export.num_blocks - export.first_index, export.first_index, error)
