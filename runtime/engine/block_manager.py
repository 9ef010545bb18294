"""Fixed-size KV blocks: allocation, ref counts, and the prefix cache.

Prefix cache: a full block is keyed by (hash of the previous block's key, its tokens), so a key names the
whole prefix up to that block. Keys are looked up in a dict, which compares the tokens on a hash match, so
two prefixes that merely collide in hash never share a block. A freed block keeps its key and stays
reusable until it is taken for new data; free blocks are taken least recently freed first (LRU).

Who may share: a sequence's first block is keyed by its cache root (`cache_root`), a tuple of the LoRA adapter's
content digest, the sharing scope the server gave the request (its tenant or trust group, or none) and the
request's `cache_salt`, compared whole: no name, salt or tenant a client picks can make two roots equal, as a
string joined from them could. The root also holds a secret drawn per process, so the hashes chained from it
cannot be predicted (nor collisions crafted) from outside (docs/runtime.md, "Prefix cache isolation").

Each sequence holding blocks gets a row of `tables` (numpy, `[max_num_seqs, max_blocks_per_seq]`), kept
in step with its `block_table`, so the model runner gathers a batch's block tables with one index.
"""
import secrets
from collections import OrderedDict
from typing import TYPE_CHECKING

import numpy as np

from kubeinfer.runtime.engine.sequence import Sequence

if TYPE_CHECKING:
    import torch

PROCESS_SECRET = secrets.randbits(64)   # in every cache root: the chain's hashes are unknown outside this process
BlockKey = tuple[object, tuple[int, ...]]   # (the cache root, or the previous block key's hash; the block's tokens)


def cache_root(seq: Sequence) -> tuple:
    """The parent of a sequence's first block: the prefixes of two sequences share blocks only when their roots
    are equal, i.e. same adapter weights (or both the base model), same sharing scope, same salt."""
    return (PROCESS_SECRET, seq.lora_id, seq.params.cache_scope, seq.params.cache_salt)


def slot_mapping(tables: "torch.Tensor", owner: "torch.Tensor", positions: "torch.Tensor",
                 block_size: int) -> "torch.Tensor":
    """The KV slot of each token: `tables[owner, position // block_size] * block_size + position % block_size`
    (`tables`: the batch's block-table rows; `owner`: each token's row in it)."""
    return tables[owner, positions // block_size].long() * block_size + positions % block_size


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, max_num_seqs: int, max_blocks_per_seq: int,
                 enable_prefix_caching: bool = True, watermark: float = 0.01):
        assert num_blocks > 0 and block_size > 0
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.watermark_blocks = int(watermark * num_blocks)
        self.ref_counts = [0] * num_blocks
        self.block_keys: list[BlockKey | None] = [None] * num_blocks
        self.block_hashes = [0] * num_blocks
        self.cached: dict[BlockKey, int] = {}
        self.free_blocks: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self.tables = np.zeros((max_num_seqs + 1, max_blocks_per_seq), dtype=np.int32)
        self.free_rows = list(range(max_num_seqs, -1, -1))
        self.rows: dict[int, int] = {}   # seq_id -> row of `tables`

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_blocks)

    @property
    def usage(self) -> float:
        """Share of blocks held by live sequences (cached but free blocks count as free)."""
        return 1.0 - len(self.free_blocks) / self.num_blocks

    def row(self, seq: Sequence) -> int:
        return self.rows[seq.seq_id]

    def _num_blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # -- admission of a sequence that holds no blocks ---------------------------------------------------
    def find_cached_blocks(self, seq: Sequence) -> list[int]:
        """Blocks that already hold a prefix of the sequence. The last token is always left to compute."""
        if not self.enable_prefix_caching:
            return []
        hits, parent, size, tokens = [], cache_root(seq), self.block_size, seq.token_ids
        for start in range(0, (seq.num_tokens - 1) // size * size, size):
            block = self.cached.get((parent, tuple(tokens[start:start + size])))
            if block is None:
                break
            hits.append(block)
            parent = self.block_hashes[block]
        return hits

    def can_allocate(self, seq: Sequence, hits: list[int], num_new_tokens: int, reserve: bool = True) -> bool:
        needed = self._num_blocks_for(len(hits) * self.block_size + num_new_tokens) - len(hits)
        revived = sum(1 for block in hits if self.ref_counts[block] == 0)  # cached blocks now in the free pool
        return needed + revived <= self.num_free_blocks - (self.watermark_blocks if reserve else 0)

    def allocate(self, seq: Sequence, hits: list[int], num_new_tokens: int) -> None:
        assert not seq.block_table and seq.seq_id not in self.rows
        self.rows[seq.seq_id] = self.free_rows.pop()
        for block in hits:
            if self.ref_counts[block] == 0:
                del self.free_blocks[block]
            self.ref_counts[block] += 1
        seq.block_table = list(hits)
        self.tables[self.rows[seq.seq_id], :len(hits)] = hits
        seq.num_computed_tokens = len(hits) * self.block_size
        seq.num_hashed_blocks = len(hits)
        seq.last_block_hash = self.block_hashes[hits[-1]] if hits else cache_root(seq)
        self._grow(seq, seq.num_computed_tokens + num_new_tokens)

    # -- growth of a running sequence ----------------------------------------------------------------------
    def can_append(self, seq: Sequence, num_new_tokens: int) -> bool:
        needed = self._num_blocks_for(seq.num_computed_tokens + num_new_tokens) - len(seq.block_table)
        return needed <= self.num_free_blocks

    def append(self, seq: Sequence, num_new_tokens: int) -> None:
        self._grow(seq, seq.num_computed_tokens + num_new_tokens)

    def _grow(self, seq: Sequence, num_tokens: int) -> None:
        row = self.tables[self.rows[seq.seq_id]]
        for _ in range(self._num_blocks_for(num_tokens) - len(seq.block_table)):
            block, _ = self.free_blocks.popitem(last=False)
            key = self.block_keys[block]
            if key is not None:  # evict its cached content
                del self.cached[key]
                self.block_keys[block] = None
            self.ref_counts[block] = 1
            row[len(seq.block_table)] = block
            seq.block_table.append(block)

    # -- after a forward -----------------------------------------------------------------------------------
    def cache_full_blocks(self, seq: Sequence) -> None:
        """Registers the blocks that this step filled with computed tokens in the prefix cache."""
        if not self.enable_prefix_caching:
            return
        size, parent = self.block_size, seq.last_block_hash
        num_full = seq.num_computed_tokens // size
        for index in range(seq.num_hashed_blocks, num_full):
            key = (parent, tuple(seq.token_ids[index * size:(index + 1) * size]))
            parent = hash(key)
            block = seq.block_table[index]
            if key not in self.cached:   # else the same prefix is already cached in another block
                self.cached[key] = block
                self.block_keys[block] = key
                self.block_hashes[block] = parent
        seq.num_hashed_blocks = max(seq.num_hashed_blocks, num_full)
        seq.last_block_hash = parent

    # -- holders other than sequences (a KV export reading blocks out after its sequence ended) -------------
    def retain(self, block: int) -> None:
        """One more holder of `block`: it is not reused (nor its cached content evicted) until released."""
        if self.ref_counts[block] == 0:
            del self.free_blocks[block]
        self.ref_counts[block] += 1

    def release(self, block: int) -> None:
        self.ref_counts[block] -= 1
        assert self.ref_counts[block] >= 0
        if self.ref_counts[block] == 0:
            self.free_blocks[block] = None

    def free(self, seq: Sequence) -> None:
        """Releases the sequence's blocks; the tail is freed first, so it is also reused first."""
        for block in reversed(seq.block_table):
            self.ref_counts[block] -= 1
            assert self.ref_counts[block] >= 0
            if self.ref_counts[block] == 0:
                self.free_blocks[block] = None
        seq.block_table = []
        seq.num_hashed_blocks = 0
        row = self.rows.pop(seq.seq_id, None)
        if row is not None:
            self.free_rows.append(row)

    def forget_cached(self) -> None:
        """Forgets every cached prefix: the pool's contents are gone (a sleeping engine freed them). No block may be
        held."""
        assert not any(self.ref_counts), "the prefix cache is forgotten only with every block free"
        self.cached.clear()
        self.block_keys = [None] * self.num_blocks
