"""The engine's grammar cache: a schema is compiled once, and each request's matcher, whether copied from the
template or built apart (many fill threads), allows exactly the same tokens at every step."""
import torch

from kubeinfer.runtime.structured import grammars
from kubeinfer.runtime.structured.bitmask import fill_bitmask
from kubeinfer.runtime.structured.formats import response_format_output

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}


def grammar() -> str:
    return response_format_output({"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA}}).grammar


def test_copied_and_built_apart_matchers_allow_the_same_tokens_at_every_step(llama_dir):
    copies = grammars.GrammarCache(str(llama_dir), 512, (0,), copy_matchers=True)
    apart = grammars.GrammarCache(str(llama_dir), 512, (0,), copy_matchers=False)
    a, b = copies.matcher(grammar()), apart.matcher(grammar())
    apart.matcher(grammar())
    assert (copies.num_compiled, apart.num_compiled) == (1, 1)
    generator = torch.Generator().manual_seed(0)
    for step in range(40):
        masks = fill_bitmask([(a, 0, []), (b, 1, [])], 2, 512)
        assert torch.equal(masks[0], masks[1]), f"step {step}"
        allowed = ((masks[0].unsqueeze(-1) >> torch.arange(32, dtype=torch.int32)) & 1).flatten()[:512].float()
        if a.is_stopped():
            break
        token = int(torch.multinomial(allowed, 1, generator=generator))
        assert a.consume_token(token) and b.consume_token(token)
    assert step > 3, "the walk ended at once"


def test_matchers_are_built_apart_from_four_fill_threads(llama_dir, monkeypatch):
    for threads, copied in ((1, True), (3, True), (4, False), (16, False)):
        monkeypatch.setattr(grammars, "fill_threads", lambda: threads)
        assert grammars.GrammarCache(str(llama_dir), 512, (0,)).copy_matchers is copied
