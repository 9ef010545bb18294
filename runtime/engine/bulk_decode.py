"""The bulk path of a step where every running sequence decodes one token without drafts: what `Scheduler.schedule`
and `Scheduler.postprocess` do sequence by sequence, in list comprehensions (a dozen method calls less per sequence:
benchmarks/step_overhead.py). tests/runtime/test_scheduler.py checks that a random workload decides, builds and
ends exactly as with the loop."""


def schedule_decodes(scheduler, batch) -> int:
    """The fast path of a step where every running sequence decodes one token, without speculation, and the
    budget and the free blocks hold them all: what the loop in `schedule` would do, in bulk. Returns how many
    running sequences it scheduled (all, or none: then the loop decides)."""
    running, block_manager = scheduler.running, scheduler.block_manager
    if (scheduler.speculative_method is not None or not running or len(running) > scheduler.max_num_batched_tokens
            or any(len(seq.token_ids) - seq.num_computed_tokens != 1 for seq in running)):
        return 0
    size = block_manager.block_size
    growing = [seq for seq in running if len(seq.block_table) * size <= seq.num_computed_tokens]
    if len(growing) > block_manager.num_free_blocks:
        return 0
    for seq in growing:
        block_manager.append(seq, 1)
    batch.seqs = list(running)
    batch.num_new_tokens = [1] * len(running)
    batch.num_decodes = len(running)
    return len(running)


def postprocess_decodes(scheduler, batch, sampled: list[list[int]]) -> tuple[list[list[int]], bool]:
    """`postprocess` of the batch's first `num_decodes` sequences (one token computed, no drafts, one sampled):
    the same effects, with the stop checks run only for a token or a length that may stop the sequence."""
    kept_all, finished = [], False
    block_manager, size, eos, max_model_len = (scheduler.block_manager, scheduler.block_manager.block_size,
                                               scheduler.eos_token_ids, scheduler.max_model_len)
    for seq, tokens in zip(batch.seqs[:batch.num_decodes], sampled):
        token = tokens[0]
        token_ids = seq.token_ids
        token_ids.append(token)
        seq.num_computed_tokens += 1
        if seq.num_computed_tokens % size == 0:   # a block filled: the only step that can cache one
            block_manager.cache_full_blocks(seq)
        params = seq.params
        if (token in eos or token in params.stop_token_ids or len(token_ids) >= max_model_len
                or len(token_ids) - seq.num_prompt_tokens >= params.max_tokens):
            reason = scheduler.stop_reason(seq, token)
            if reason is not None:
                scheduler.finish_one(seq, reason, token if token in params.stop_token_ids else None)
                finished = True
        kept_all.append(tokens)
    return kept_all, finished
