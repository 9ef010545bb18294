"""Structured output on a real trained model, SmolLM2-135M-Instruct: with the layout the model was trained to write
(json_layout) and the bounds of `enforceable`, its answers end by themselves where a compact-only grammar made it
write digits to max_tokens, and twenty pydantic schemas users write are answered validly. Greedy and sampled, fp32,
one batch each (the figures: docs/server.md, "Structured output")."""
import json

import jsonschema
import pytest
from pydantic import BaseModel

from kubeinfer.runtime.layers import sampler as sampler_module
from kubeinfer.runtime.llm import LLM
from kubeinfer.runtime.sampling_params import SamplingParams
from kubeinfer.runtime.server.chat import render_chat
from kubeinfer.runtime.structured.enforceable import FRACTION_DIGITS
from kubeinfer.runtime.structured.formats import response_format_output
from kubeinfer.runtime.structured.schema_check import json_schema_output
from support.pydantic_cases import CASES, Book, CityFacts

POPULATION = ["What is the capital of France and its population? Reply in JSON.",
              "Paris population in millions, as JSON.",
              "Which city is the capital of France? How many people live there?",
              "Describe the largest city of Japan in JSON.", "Give me a JSON object about Berlin."]
MAX_TOKENS = 256


class Product(BaseModel):
    name: str
    url: str


# Greedy, the model writes these links as digits and dashes that go round until max_tokens (string_loops.py).
LOOPING_STRINGS = ["Give me an Amazon product with its link as JSON.", "An example web search result as JSON."]


def output_format(model, layout: str = "model"):
    return response_format_output({"type": "json_schema", "json_schema": {
        "name": model.__name__, "schema": model.model_json_schema(), "strict": True}}, layout=layout)


@pytest.fixture(scope="module")
def llm(smollm2):
    with LLM(str(smollm2), kv_cache_memory_gib=0.5, max_model_len=2048) as engine:
        yield engine


def ask(llm, questions: list[str], formats: list, **sampling):
    tokenizer = llm.tokenizer
    prompts = [render_chat(tokenizer.chat_template, [{"role": "user", "content": q}], True, tokenizer.bos_token,
                           tokenizer.eos_token) for q in questions]
    return llm.generate(prompts, [SamplingParams(max_tokens=MAX_TOKENS, structured=f, **sampling) for f in formats])


def test_the_population_answer_ends_where_the_model_ends_it(llm):
    bounded = ask(llm, POPULATION, [output_format(CityFacts)] * len(POPULATION), temperature=0)
    compact = ask(llm, POPULATION[:1], [output_format(CityFacts, "compact")], temperature=0)
    # Compact, the newline the model wants after the number is forbidden and digits are all that is left: only the
    # digit bound ends it (before the bound it ran to max_tokens: 11.1988888...).
    number = str(json.loads(compact[0].text)["population_millions"])
    assert len(number.split(".")[1]) == FRACTION_DIGITS, compact[0].text
    for output in bounded:
        assert output.finish_reason == "stop" and len(output.token_ids) < 64, output.text
        jsonschema.validate(json.loads(output.text), CityFacts.model_json_schema())
    assert bounded[0].text.startswith('{\n  "city": "Paris",\n  "country": "'), bounded[0].text


def answers(llm, temperature: float) -> list:
    """The twenty schemas' questions answered under their schemas; each finished answer validated by its model."""
    outputs = ask(llm, [question for _, question in CASES], [output_format(model) for model, _ in CASES],
                  temperature=temperature, **({"seed": 0} if temperature else {}))
    for (model, _), output in zip(CASES, outputs):
        if output.finish_reason == "stop":
            model.model_validate_json(output.text)
    return outputs


def test_twenty_pydantic_schemas_are_answered_validly(llm):
    cut = [o.text[:80] for o in answers(llm, 0) if o.finish_reason == "length"]
    # Measured: greedy cuts none of 20 with the loop guard; 3 without it, each a list or a string repeating one block
    # ("Fantasy", "Fantasy", ...), a greedy loop the model shows without any grammar too (12 of 26 unconstrained
    # answers ran to max_tokens).
    assert len(cut) <= 1, cut


def test_the_loop_guard_ends_a_list_that_repeats_one_item(llm, monkeypatch):
    """Greedy, the model lists the book's genres as "Fantasy" over and over, legally, to max_tokens; with the guard
    the list ends after a few repeats and the answer validates."""
    question = [q for model, q in CASES if model is Book]
    bans = llm.engine.core.stats().structured_loop_bans
    guarded = ask(llm, question, [output_format(Book)], temperature=0)[0]
    assert llm.engine.core.stats().structured_loop_bans > bans   # counted (kubeinfer_structured_loop_bans_total)
    monkeypatch.setattr(sampler_module, "ban_loops", lambda *args: 0)
    looping = ask(llm, question, [output_format(Book)], temperature=0)[0]
    assert looping.finish_reason == "length" and looping.text.count('"Fantasy"') > 20, looping.text
    assert guarded.finish_reason == "stop", guarded.text
    Book.model_validate_json(guarded.text)


def test_the_string_guard_ends_a_string_that_loops(llm, monkeypatch):
    """Greedy, the link string goes round (`1234567890-1234567890-20-...`), legally, to max_tokens; with the guard it
    ends once its last 64 tokens are nearly all repeats, and the answers validate."""
    formats = [output_format(Product)] * len(LOOPING_STRINGS)
    bans = llm.engine.core.stats().structured_loop_bans
    guarded = ask(llm, LOOPING_STRINGS, formats, temperature=0)
    assert llm.engine.core.stats().structured_loop_bans > bans   # counted with the loop guard's bans
    monkeypatch.setattr(sampler_module, "close_looping_strings", lambda *args: 0)
    looping = ask(llm, LOOPING_STRINGS, formats, temperature=0)
    for closed, cut in zip(guarded, looping):
        assert cut.finish_reason == "length", cut.text
        assert closed.finish_reason == "stop", closed.text
        assert closed.text[:60] == cut.text[:60]   # the same answer up to the loop
        Product.model_validate_json(closed.text)


def test_an_object_that_repeats_a_key_is_ended(llm, monkeypatch):
    """Greedy, asked for an example of these SDK types (the corpus sample's prompt), the model goes round in an open
    object (`"status_message": "Hello, World! ...", "status_message": ...`; keys that grow `"event_type_19":
    "event_type_19", ...` and come back) to max_tokens; with the guard the object takes no member after its first
    repeated key, and the answers end and validate."""
    from openai.types.beta.beta_web_search_preview_tool import BetaWebSearchPreviewTool
    from openai.types.realtime.conversation_item_truncate_event import ConversationItemTruncateEvent
    from openai.types.webhooks.batch_cancelled_webhook_event import BatchCancelledWebhookEvent
    models = [BetaWebSearchPreviewTool, ConversationItemTruncateEvent, BatchCancelledWebhookEvent]
    formats = [json_schema_output(model.model_json_schema(), "schema") for model in models]
    tokenizer = llm.tokenizer
    prompts = [render_chat(tokenizer.chat_template, [{"role": "user", "content": (
        f"Give one example of a {model.__name__} as JSON.")}], True, tokenizer.bos_token, tokenizer.eos_token)
        for model in models]

    def answers():
        return llm.generate(prompts, [SamplingParams(temperature=0, max_tokens=512, structured=f) for f in formats])
    guarded = answers()
    monkeypatch.setattr(sampler_module, "end_repeating_objects", lambda *args: 0)
    for model, ended, cut in zip(models, guarded, answers()):
        assert cut.finish_reason == "length", cut.text
        assert ended.finish_reason == "stop", ended.text
        model.model_validate_json(ended.text)


@pytest.mark.slow
def test_twenty_pydantic_schemas_sampled_are_answered_validly(llm):
    """The same at temperature 0.7 (half of the greedy test's time again; -m slow): measured, none cut."""
    sampled = answers(llm, 0.7)
    assert sum(o.finish_reason == "length" for o in sampled) <= 1, [o.text[:80] for o in sampled]


def test_speculative_decoding_keeps_the_answers(llm, smollm2):
    """n-gram drafts the grammar refuses are never accepted, and the loop guards judge each draft row after its drafts:
    greedy answers with speculation equal those without."""
    from openai.types.beta.beta_web_search_preview_tool import BetaWebSearchPreviewTool
    from openai.types.realtime.conversation_item_truncate_event import ConversationItemTruncateEvent
    repeating = [BetaWebSearchPreviewTool, ConversationItemTruncateEvent]   # objects that repeat a key (guarded)
    questions = (POPULATION + LOOPING_STRINGS
                 + [f"Give one example of a {model.__name__} as JSON." for model in repeating])
    formats = ([output_format(CityFacts)] * len(POPULATION) + [output_format(Product)] * len(LOOPING_STRINGS)
               + [json_schema_output(model.model_json_schema(), "schema") for model in repeating])
    plain = [o.text for o in ask(llm, questions, formats, temperature=0)]
    with LLM(str(smollm2), kv_cache_memory_gib=0.5, max_model_len=2048, speculative_method="ngram",
             speculative_ngram_min=1) as speculating:
        assert [o.text for o in ask(speculating, questions, formats, temperature=0)] == plain
        stats = speculating.engine.core.scheduler.stats
    assert stats.num_draft_tokens > stats.num_accepted_tokens > 0   # drafted, some kept, some refused
