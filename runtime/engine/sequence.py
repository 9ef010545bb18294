"""A request as the engine sees it: its tokens, sampling settings, KV blocks and progress."""
import enum
import itertools
import time

from kubeinfer.runtime.sampling_params import SamplingParams


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    RECEIVING = "receiving"   # its prompt's KV is being pulled from a prefill replica (runtime/disagg)
    FINISHED = "finished"


class Sequence:
    _ids = itertools.count()

    def __init__(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                 arrival_time: float | None = None, output_token_ids: list[int] = ()):
        """`output_token_ids`: output already produced elsewhere (a request resumed after its replica died): they
        count as output (max_tokens, min_tokens, penalties, a seed's draws) and are prefilled with the prompt."""
        self.seq_id = next(Sequence._ids)
        self.request_id = request_id
        self.token_ids = list(prompt_token_ids) + list(output_token_ids)
        self.num_prompt_tokens = len(prompt_token_ids)
        self.params = params
        self.status = SequenceStatus.WAITING
        self.block_table: list[int] = []
        self.num_computed_tokens = 0   # tokens whose K/V are in the cache
        self.num_cached_tokens = 0     # of the prompt, served by the prefix cache at first admission
        self.num_hashed_blocks = 0     # leading full blocks registered in the prefix cache
        self.last_block_hash: object = None   # the last registered block's hash (or the cache root: none yet)
        self.num_preemptions = 0
        self.num_charged_tokens = 0    # the fair policy's count of tokens computed for it (recomputes excluded)
        self.finish_reason: str | None = None
        self.stop_reason: str | int | None = None
        self.logprobs: list[dict] = []
        self.arrival_time = arrival_time if arrival_time is not None else time.monotonic()
        self.scheduled_time: float | None = None      # first scheduled (its queue wait ends; monotonic clock)
        self.first_token_time: float | None = None
        self.queue_key = self.arrival_time    # the waiting queue's order (Scheduler.add; -inf once preempted)
        self.generator = None          # torch.Generator when the request has a seed (made by the sampler)
        self.draft_token_ids: list[int] = []   # proposed for this step, verified by its forward (speculation)
        self.num_draft_computed = 0            # tokens whose K/V are in the draft model's cache (draft method)
        self.draft_limit: int | None = None    # drafts to propose next step (adapted to acceptance); None: all
        self.guide = None   # structured output: the grammar's matcher, advanced by every kept output token
        self.string_scan = None   # and the answer's strings as the string loop guard reads them (string_loops.py)
        self.key_scan = None      # and its objects' keys as the repeated-key guard reads them (duplicate_keys.py)
        self.lora_path: str | None = None   # the folder of its adapter (params.lora_name), resolved at admission
        self.lora_id: str | None = None     # its adapter's content digest: what its prefix cache blocks are keyed by
        self.lora_slot: int | None = None   # the device slot of its adapter while it runs (lora/slot_table.py)

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def last_token_id(self) -> int:
        return self.token_ids[-1]

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    @property
    def num_uncomputed_tokens(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens

    def append_token(self, token_id: int) -> None:
        self.token_ids.append(token_id)
