"""The engine's compiled grammars: one llguidance tokenizer for the model, and a matcher per grammar kept as a
template (least recently used out), so a schema is checked and compiled once.

Each request gets its own matcher, a copy of the template or one built apart. Copies of one template share its
lexer state behind one lock, so their masks are filled one at a time however many threads the fill pool has; built
apart, they fill in parallel but start with a cold lexer (slower on one thread). Measured with
benchmarks/grammar_fill_threads.py (batch 256, a 32k vocabulary, one JSON schema) on a 16-CPU host: copies 22.7 ms
a fill at 1 thread and 18-23 ms at 4-16; built apart 41.7 ms at 1 thread, 12.9 at 4, 10.9 at 16. On the 2-vCPU box
(batch 64, 2 threads): copies 3.1 ms, built apart 7.9. So: copies below a pool of 4 threads, built apart from 4."""
import logging
import time
from collections import OrderedDict
from pathlib import Path

import llguidance

from kubeinfer.runtime.errors import InvalidRequestError
from kubeinfer.runtime.structured.bitmask import fill_threads
from kubeinfer.runtime.structured.duplicate_keys import CommaTokens, KeyScan
from kubeinfer.runtime.structured.string_loops import StringScan, TokenTable

logger = logging.getLogger(__name__)
DEFAULT_CAPACITY = 256
PARALLEL_FILL_THREADS = 4   # from this many fill threads, each request's matcher is built apart (see above)


class GrammarCache:
    def __init__(self, model_dir: str, vocab_size: int, eos_token_ids: tuple[int, ...],
                 capacity: int = DEFAULT_CAPACITY, copy_matchers: bool | None = None):
        self.model_dir, self.vocab_size, self.eos_token_ids = model_dir, vocab_size, list(eos_token_ids)
        self.capacity = capacity
        self.copy_matchers = fill_threads() < PARALLEL_FILL_THREADS if copy_matchers is None else copy_matchers
        self._tokenizer: llguidance.LLTokenizer | None = None   # built at the first constrained request
        self._token_table: TokenTable | None = None
        self._comma_tokens: CommaTokens | None = None
        self._templates: OrderedDict[str, llguidance.LLMatcher] = OrderedDict()
        self.num_compiled = 0

    @property
    def tokenizer(self) -> llguidance.LLTokenizer:
        if self._tokenizer is None:
            started = time.perf_counter()
            text = (Path(self.model_dir) / "tokenizer.json").read_text()
            # The model's vocabulary may be wider than the tokenizer's (padding rows): the mask covers all of it.
            self._tokenizer = llguidance.LLTokenizer(text, n_vocab=self.vocab_size, eos_token=self.eos_token_ids)
            logger.info("structured output: tokenizer ready for the grammar library in %.2f s",
                        time.perf_counter() - started)
        return self._tokenizer

    @property
    def token_table(self) -> TokenTable:
        """Each token's bytes, and whether it can end a string, for the string loop guard (string_loops.py); built
        once, at the first constrained request."""
        if self._token_table is None:
            self._token_table = TokenTable.of(self.tokenizer, self.vocab_size)
        return self._token_table

    def guard_scans(self) -> tuple[StringScan, KeyScan]:
        """A new answer's scans for the string loop guard (string_loops.py) and the repeated-key guard
        (duplicate_keys.py); the tables they read are built once, at the first constrained request."""
        if self._comma_tokens is None:
            self._comma_tokens = CommaTokens(self.token_table.token_bytes, self.vocab_size)
        return StringScan(self.token_table), KeyScan(self.token_table.token_bytes, self._comma_tokens)

    def matcher(self, grammar: str) -> llguidance.LLMatcher:
        """A fresh matcher of `grammar` (checked and compiled once; then copied, or built apart)."""
        template = self._templates.get(grammar)
        if template is None:
            template = self._build(grammar)
            if template.is_error():
                raise InvalidRequestError(f"the grammar cannot be compiled: {template.get_error()}", "response_format")
            self.num_compiled += 1
            self._templates[grammar] = template
            while len(self._templates) > self.capacity:
                self._templates.popitem(last=False)
        self._templates.move_to_end(grammar)
        return template.deep_copy() if self.copy_matchers else self._build(grammar)

    def _build(self, grammar: str) -> llguidance.LLMatcher:
        return llguidance.LLMatcher(self.tokenizer, grammar, log_level=0)
