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


class IncrementalDetokenizer:
    """Turns a growing list of token ids into text deltas.

    A token can end inside a multi-byte character; its text then ends in U+FFFD, and it is held back until
    a later token completes the character. A few tokens before the read point are decoded with the new
    ones so that tokenizers whose spacing depends on the previous token decode right.
    """

    def __init__(self, tokenizer: Tokenizer, prompt_token_ids: list[int], skip_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.read_offset = len(prompt_token_ids)
        self.prefix_offset = max(self.read_offset - 5, 0)

    def step(self, token_ids: list[int]) -> str:
        """The new text that `token_ids` (all tokens so far, prompt included) adds; "" while incomplete."""
        decode = self.tokenizer.decode
        prefix_text = decode(token_ids[self.prefix_offset:self.read_offset], self.skip_special_tokens)
        full_text = decode(token_ids[self.prefix_offset:], self.skip_special_tokens)
        if len(full_text) > len(prefix_text) and not full_text.endswith("\ufffd"):
            self.prefix_offset, self.read_offset = self.read_offset, len(token_ids)
            return full_text[len(prefix_text):]
        return ""

    def flush(self, token_ids: list[int]) -> str:
        """Whatever is still held back, at the end of a sequence (an incomplete character included)."""
        prefix_text = self.tokenizer.decode(token_ids[self.prefix_offset:self.read_offset], self.skip_special_tokens)
        full_text = self.tokenizer.decode(token_ids[self.prefix_offset:], self.skip_special_tokens)
        self.prefix_offset = self.read_offset = len(token_ids)
        return full_text[len(prefix_text):]
