"""The engine's compiled grammars: one llguidance tokenizer for the model, and a matcher per grammar kept as a
template (least recently used out), so a schema is compiled once and each request gets a cheap copy."""
import logging
import time
from collections import OrderedDict
from pathlib import Path

import llguidance

from kubeinfer.runtime.errors import InvalidRequestError

logger = logging.getLogger(__name__)
DEFAULT_CAPACITY = 256


class GrammarCache:
    def __init__(self, model_dir: str, vocab_size: int, eos_token_ids: tuple[int, ...],
                 capacity: int = DEFAULT_CAPACITY):
        self.model_dir, self.vocab_size, self.eos_token_ids = model_dir, vocab_size, list(eos_token_ids)
        self.capacity = capacity
        self._tokenizer: llguidance.LLTokenizer | None = None   # built at the first constrained request
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

    def matcher(self, grammar: str) -> llguidance.LLMatcher:
        """A fresh matcher of `grammar` (compiled once, then copied)."""
        template = self._templates.get(grammar)
        if template is None:
            template = llguidance.LLMatcher(self.tokenizer, grammar, log_level=0)
            if template.is_error():
                raise InvalidRequestError(f"the grammar cannot be compiled: {template.get_error()}", "response_format")
            self.num_compiled += 1
            self._templates[grammar] = template
            while len(self._templates) > self.capacity:
                self._templates.popitem(last=False)
        self._templates.move_to_end(grammar)
        return template.deep_copy()
