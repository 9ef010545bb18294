"""Prompt lookup: proposes the tokens that followed the latest earlier occurrence of the context's last n tokens.

No extra weights. Where the output repeats its context (code edits, quoting a document, multi-turn chats that
restate), the continuation of an earlier match is often what the model writes next; the target model checks
the proposal in one forward (see `kubeinfer.runtime.layers.sampler.Sampler.verify`).

The longest suffix wins (n from `max_n` down to `min_n`), and of its earlier occurrences the latest, which is
the nearest in topic; its continuation is copied the way LZ77 copies, reading on into the copy itself. The search runs in C (`bytes.rfind` over the ids packed as int32), so a context of a
few thousand tokens costs microseconds per sequence and step.
"""
from array import array

ITEM = 4   # bytes per packed token id


def propose_ngram(token_ids: list[int], num_tokens: int, min_n: int, max_n: int) -> list[int]:
    """Up to `num_tokens` tokens that followed the latest earlier occurrence of the longest suffix of
    `token_ids` of length in [`min_n`, `max_n`]; [] if no such suffix occurs earlier."""
    length = len(token_ids)
    if num_tokens < 1 or length <= min_n:
        return []
    packed = array("i", token_ids).tobytes()
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        suffix = packed[(length - n) * ITEM:]
        # An earlier occurrence ends before the last token, so at least one token follows it.
        end = (length - 1) * ITEM
        while True:
            found = packed.rfind(suffix, 0, end)
            if found < 0:
                break
            if found % ITEM == 0:   # aligned on a token, not straddling two
                return _continuation(token_ids, found // ITEM + n, num_tokens)
            end = found + len(suffix) - 1
    return []


def _continuation(token_ids: list[int], start: int, num_tokens: int) -> list[int]:
    """`num_tokens` tokens copied from `start` on; a copy that reaches the end of the context goes on reading
    what it has just copied (as LZ77 does), so a loop of period p is proposed in full, not p tokens of it."""
    proposal = token_ids[start:start + num_tokens]
    length = len(token_ids)
    while len(proposal) < num_tokens:
        proposal.append(proposal[start + len(proposal) - length])
    return proposal
