"""The model's tokenizer, read from `tokenizer.json` and `tokenizer_config.json` with `tokenizers`."""
import json
from pathlib import Path

from tokenizers import Tokenizer as _Tokenizer

from kubeinfer.runtime.errors import ModelLoadError


class Tokenizer:
    def __init__(self, model_dir: str | Path):
        model_dir = Path(model_dir)
        path = model_dir / "tokenizer.json"
        if not path.is_file():
            raise ModelLoadError(f"{model_dir}: no tokenizer.json (a fast tokenizer is required)")
        self._tokenizer = _Tokenizer.from_file(str(path))
        config_path = model_dir / "tokenizer_config.json"
        self.config = json.loads(config_path.read_text()) if config_path.is_file() else {}
        self.chat_template: str | None = self.config.get("chat_template")
        template_file = model_dir / "chat_template.jinja"
        if self.chat_template is None and template_file.is_file():
            self.chat_template = template_file.read_text()
        self.eos_token = _token_text(self.config.get("eos_token"))
        self.bos_token = _token_text(self.config.get("bos_token"))
        self.eos_token_id = self._tokenizer.token_to_id(self.eos_token) if self.eos_token else None

    @property
    def vocab_size(self) -> int:
        return self._tokenizer.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._tokenizer.decode(token_ids, skip_special_tokens=skip_special_tokens)

    def id_to_token(self, token_id: int) -> str | None:
        return self._tokenizer.id_to_token(token_id)


def _token_text(token) -> str | None:
    """tokenizer_config.json writes special tokens as strings or as AddedToken dicts."""
    if isinstance(token, dict):
        return token.get("content")
    return token


def eos_token_ids(model_eos: tuple[int, ...], tokenizer: Tokenizer) -> tuple[int, ...]:
    """The model's EOS ids (config.json / generation_config.json), or the tokenizer's when the model names none."""
    if not model_eos and tokenizer.eos_token_id is not None:
        return (tokenizer.eos_token_id,)
    return tuple(model_eos)


# A character split over tokens decodes as at most three U+FFFD (byte-fallback tokenizers give one per byte
# of an incomplete four-byte character, byte-level BPE one for the whole incomplete tail).
MAX_INCOMPLETE_CHARS = 3


class IncrementalDetokenizer:
    """Turns a growing list of token ids into text deltas.

    A token can end inside a multi-byte character; its text then ends in U+FFFD, and that tail is held back
    until a later token completes the character. Only the tail: the text before its last three U+FFFD can no
    longer change, so it is sent at once. A model that writes invalid bytes (a random-weight model does, a
    real one sometimes) thus streams them as U+FFFD as it goes, instead of holding the whole output back until
    the sequence ends. A few tokens before the read point are decoded with the new ones so that tokenizers
    whose spacing depends on the previous token decode right.
    """

    def __init__(self, tokenizer: Tokenizer, prompt_token_ids: list[int], skip_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.read_offset = len(prompt_token_ids)
        self.prefix_offset = max(self.read_offset - 5, 0)
        self.sent = 0   # characters after the read point already returned (text before an incomplete tail)

    def step(self, token_ids: list[int]) -> str:
        """The new text that `token_ids` (all tokens so far, prompt included) adds; "" while incomplete."""
        new_text = self._new_text(token_ids)
        incomplete = len(new_text) - len(new_text.rstrip("\ufffd"))
        if new_text and not incomplete:
            delta, self.sent = new_text[self.sent:], 0
            self.prefix_offset, self.read_offset = self.read_offset, len(token_ids)
            return delta
        stable = len(new_text) - min(incomplete, MAX_INCOMPLETE_CHARS)
        if stable <= self.sent:
            return ""
        delta, self.sent = new_text[self.sent:stable], stable
        return delta

    def flush(self, token_ids: list[int]) -> str:
        """Whatever is still held back, at the end of a sequence (an incomplete character included)."""
        delta = self._new_text(token_ids)[self.sent:]
        self.prefix_offset = self.read_offset = len(token_ids)
        self.sent = 0
        return delta

    def _new_text(self, token_ids: list[int]) -> str:
        decode = self.tokenizer.decode
        prefix_text = decode(token_ids[self.prefix_offset:self.read_offset], self.skip_special_tokens)
        full_text = decode(token_ids[self.prefix_offset:], self.skip_special_tokens)
        return full_text[len(prefix_text):]
