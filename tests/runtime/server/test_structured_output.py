"""Structured output through the real server (the engine in its own process) with the official openai client: with
the random-weight model, every output parses and validates against its schema (jsonschema, the reference
validator), finishes by itself within a max_tokens the layout's bounds imply, and lays its JSON out only as
json_layout allows (per gap: nothing, a space, or one newline and bounded indentation); an answer the grammar only
over-approximates is held and checked, a sampled one that breaks its schema is drawn again, and one that still breaks
it is a 422, never sent."""
import asyncio
import json
import re
from types import SimpleNamespace
from typing import Annotated, Literal

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from kubeinfer.runtime.engine.output_processor import RequestOutput
from kubeinfer.runtime.sampling_params import SamplingParams
from kubeinfer.runtime.server.admission import Job
from kubeinfer.runtime.server.auth import KeyEntry, KeyRing, Tenant
from kubeinfer.runtime.server.checked_answers import RESAMPLES, resampled
from kubeinfer.runtime.structured.spec import StructuredOutput
from kubeinfer.runtime.structured.enforceable import enforceable
from kubeinfer.runtime.structured.json_layout import INDENT, nesting
from support import metric_value, scrape_metrics

MODEL = "tiny"
SCHEMA = {
    "type": "object", "additionalProperties": False,
    "required": ["name", "age", "tags", "role", "active", "address", "code"],
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 10},
        "age": {"type": "integer", "minimum": 18, "maximum": 99},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 5}, "minItems": 1, "maxItems": 3},
        "role": {"enum": ["admin", "user", "guest"]},
        "active": {"type": "boolean"},
        "address": {"$ref": "#/$defs/address"},
        "code": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{3}$"},
        "note": {"anyOf": [{"type": "null"}, {"type": "string", "maxLength": 4}]},
    },
    "$defs": {"address": {"type": "object", "additionalProperties": False, "required": ["zip", "kind"],
                          "properties": {"zip": {"type": "string", "pattern": "^[0-9]{5}$"},
                                         "kind": {"const": "home"}}}},
}
FORMAT = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA, "strict": True}}
STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"')


class Pet(BaseModel):
    name: str = Field(max_length=8)
    legs: int = Field(ge=0, le=8)
    kind: Literal["cat", "dog", "bird"]
    friends: list[Annotated[str, Field(max_length=6)]] = Field(max_length=2)   # bounded: random weights


@pytest.fixture(scope="module")
def client(server):
    url, _ = server
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)


def assert_valid_laid_out(text: str, schema: dict) -> None:
    jsonschema.validate(json.loads(text), schema)
    assert_bounded_gaps(text, schema)


def assert_bounded_gaps(text: str, schema: dict) -> None:
    gaps = re.findall(r"\s+", STRINGS.sub('""', text))
    widest = INDENT * (nesting(*[enforceable(schema)[0]] * 2) + 1)
    assert all(re.fullmatch(rf" |\n[ \t]{{0,{widest}}}", gap) for gap in gaps), f"unbounded whitespace: {text!r}"


def test_every_sampled_output_validates_or_is_cut_inside_the_layout_bounds(client):
    """Random weights at temperature 1 pick whitespace as often as anything the grammar allows, so some answers use
    every gap's bound and run out of tokens: those must still be laid out within the bounds; the rest validate."""
    chat = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "a person"}], n=12,
                                          temperature=1.0, seed=7, max_tokens=200, response_format=FORMAT)
    completion = client.completions.create(model=MODEL, prompt="a person:", n=4, temperature=1.0, seed=1,
                                           max_tokens=200, extra_body={"response_format": FORMAT})
    choices = [(c.message.content, c.finish_reason) for c in chat.choices]
    choices += [(c.text, c.finish_reason) for c in completion.choices]
    finished = [text for text, reason in choices if reason == "stop"]
    assert len(finished) >= 4, choices
    for text in finished:
        assert_valid_laid_out(text, SCHEMA)
    for text, reason in choices:
        assert reason in ("stop", "length") and text.startswith("{")
        assert_bounded_gaps(text, SCHEMA)
    assert len(set(finished)) > 1   # sampled, not one forced answer


def test_streamed_greedy_output_equals_the_whole_one(client):
    messages = [{"role": "user", "content": "a person"}]
    whole = client.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=160,
                                           response_format=FORMAT)
    chunks = list(client.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=160,
                                                 response_format=FORMAT, stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text == whole.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason
    if whole.choices[0].finish_reason == "stop":   # greedy random weights may spend every gap's bound
        assert_valid_laid_out(text, SCHEMA)
    assert_bounded_gaps(text, SCHEMA)


def test_json_object_gives_an_object(client):
    """Any object is unbounded (keys and values of any length): a random model may run out of tokens inside one,
    so only the outputs that ended by themselves must parse; most do."""
    result = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "json"}], n=8,
                                            temperature=1.0, seed=3, max_tokens=64,
                                            response_format={"type": "json_object"})
    finished = [c.message.content for c in result.choices if c.finish_reason == "stop"]
    assert len(finished) >= 4, [c.message.content for c in result.choices]
    for text in finished:
        assert isinstance(json.loads(text), dict)
    for choice in result.choices:
        assert choice.message.content.startswith("{")


@pytest.fixture(scope="module")
def compact_client(llama_dir, start_server):
    """A server writing compact JSON: random weights at temperature 0.8 would spend each gap's whitespace bound."""
    with start_server(llama_dir, max_model_len=256, json_layout="compact") as (url, _):
        yield openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)


def test_parse_with_a_pydantic_model(compact_client):
    client = compact_client
    parsed = client.chat.completions.parse(model=MODEL, messages=[{"role": "user", "content": "a pet"}],
                                           response_format=Pet, max_tokens=100, temperature=0.8, seed=2)
    pet = parsed.choices[0].message.parsed
    assert isinstance(pet, Pet) and pet.kind in ("cat", "dog", "bird") and 0 <= pet.legs <= 8
    response = client.responses.parse(model=MODEL, input="a pet", text_format=Pet, max_output_tokens=100,
                                      temperature=0.8)
    assert isinstance(response.output_parsed, Pet) and response.status == "completed"
    with client.responses.stream(model=MODEL, input="a pet", text_format=Pet, max_output_tokens=100,
                                 temperature=0) as stream:
        final = stream.get_final_response()
    assert isinstance(final.output_parsed, Pet)


BAD = [
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "$dynamicAnchor": "n", "type": "object", "properties": {"c": {"$dynamicRef": "#n"}}}}},
     "response_format.json_schema.schema", "$dynamicAnchor"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "not": {}}}},
     "response_format.json_schema.schema", "unsatisfiable"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "properties": {"age": {"type": "strin"}}}}},
     "response_format.json_schema.schema", "properties.age.type"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string", "maxLength": -1}}},
     "response_format.json_schema.schema", "maxLength"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "integer", "minimum": 3, "maximum": 1}}},
     "response_format.json_schema.schema", "unsatisfiable"),
    ({"type": "json_schema", "json_schema": {"name": "x"}}, "response_format.json_schema.schema", "required"),
    ({"type": "json_schema"}, "response_format.json_schema", "required"),
    ({"type": "yaml"}, "response_format.type", "yaml"),
]


@pytest.mark.parametrize("response_format, param, named", BAD)
def test_bad_formats_are_400s_naming_the_field(server, response_format, param, named):
    url, _ = server
    for path, body in (("chat/completions", {"messages": [{"role": "user", "content": "x"}]}),
                       ("completions", {"prompt": "x"})):
        reply = httpx.post(f"{url}/v1/{path}", json={"model": MODEL, "response_format": response_format} | body)
        assert reply.status_code == 400, reply.text
        error = reply.json()["error"]
        assert error["param"] == param and named in error["message"], error


def test_text_format_errors_and_conflicts_name_the_param(server):
    url, _ = server
    bad = {"format": {"type": "json_schema", "name": "x", "schema": {"type": "array", "maxItems": 1, "minItems": 2}}}
    reply = httpx.post(f"{url}/v1/responses", json={"model": MODEL, "input": "x", "text": bad})
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "text.format.schema"
    assert "unsatisfiable" in reply.json()["error"]["message"]
    for extra, param in (({"ignore_eos": True}, "ignore_eos"), ({"min_tokens": 2}, "min_tokens")):
        reply = httpx.post(f"{url}/v1/chat/completions", json={
            "model": MODEL, "messages": [{"role": "user", "content": "x"}], "response_format": FORMAT} | extra)
        assert reply.status_code == 400 and reply.json()["error"]["param"] == param, reply.text


# The grammar forces [1, 1] (two items, each 1); uniqueItems is checked after: every answer breaks it.
DOOMED = {"type": "json_schema", "json_schema": {"name": "pair", "schema": {
    "type": "array", "items": {"const": 1}, "minItems": 2, "maxItems": 2, "uniqueItems": True}}}
HELD = {"type": "json_schema", "json_schema": {"name": "pair", "schema": {   # forced to [1, 2]: unique
    "type": "array", "prefixItems": [{"const": 1}, {"const": 2}], "items": False, "minItems": 2, "uniqueItems": True}}}


def resamples(url: str) -> float:
    return metric_value(scrape_metrics(url), "kubeinfer_structured_resamples_total", model_name=MODEL)


def test_an_answer_that_breaks_its_schema_is_a_422_never_sent(server, client):
    url, _ = server
    body = {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "response_format": DOOMED,
            "max_tokens": 32}
    before = resamples(url)
    reply = httpx.post(f"{url}/v1/chat/completions", json=body)   # temperature 1: drawn 1 + RESAMPLES times
    assert reply.status_code == 422, reply.text
    error = reply.json()["error"]
    assert error["code"] == "schema_not_satisfied" and "uniqueItems" in error["message"], error
    assert f"{1 + RESAMPLES} answers sampled, none did" in error["message"] and resamples(url) == before + RESAMPLES
    greedy = httpx.post(f"{url}/v1/chat/completions", json=body | {"temperature": 0})   # would come out the same
    assert greedy.status_code == 422 and "sampled" not in greedy.json()["error"]["message"], greedy.text
    assert resamples(url) == before + RESAMPLES
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body | {"stream": True}) as stream:
        events = [line.removeprefix("data: ") for line in stream.iter_lines() if line.startswith("data: ")]
    chunks, error = [json.loads(event) for event in events[:-1]], json.loads(events[-1])
    assert not any(choice["delta"].get("content") for chunk in chunks for choice in chunk["choices"]), chunks
    assert error["error"]["code"] == "schema_not_satisfied", events
    response = httpx.post(f"{url}/v1/responses", json={"model": MODEL, "input": "x", "stream": True,
                                                        "text": {"format": dict(DOOMED["json_schema"],
                                                                                type="json_schema")}})
    assert "schema_not_satisfied" in response.text and "response.output_text.delta" not in response.text


# Two items of 1 or 2, unique: the grammar allows [1, 1] and [2, 2] too, which the check refuses.
COIN = {"type": "json_schema", "json_schema": {"name": "pair", "schema": {
    "type": "array", "items": {"enum": [1, 2]}, "minItems": 2, "maxItems": 2, "uniqueItems": True}}}


def test_a_held_answer_that_fails_its_check_is_sampled_again(server):
    """Seeded requests, each reproducible: where the first draw breaks uniqueItems and a later one does not, the
    client gets the later one (without resampling, a 422); every answer sent validates."""
    url, _ = server
    schema = COIN["json_schema"]["schema"]
    rescued = refused = 0
    for seed in range(24):
        before = resamples(url)
        reply = httpx.post(f"{url}/v1/chat/completions", json={
            "model": MODEL, "messages": [{"role": "user", "content": "x"}], "response_format": COIN,
            "max_tokens": 64, "temperature": 1.5, "seed": seed})
        drawn_again = resamples(url) - before
        if reply.status_code == 422:
            refused += 1
            assert drawn_again == RESAMPLES, reply.text
            continue
        assert reply.status_code == 200, reply.text
        choice = reply.json()["choices"][0]
        assert choice["finish_reason"] == "stop", choice   # the layout's bounds end it well within 64 tokens
        jsonschema.validate(json.loads(choice["message"]["content"]), schema)
        rescued += drawn_again > 0
    assert rescued > 0, f"no first draw failed its check in 24 seeds ({refused} refused): the test proves nothing"


def test_every_answer_thrown_away_is_charged_to_the_key():
    """Two draws fail uniqueItems and are drawn again; the client gets the third. The key's quota pays for all
    three: the thrown-away answers were computed all the same."""
    answers = iter([("[1, 1]", [11, 12, 13, 14]), ("[2, 2]", [21, 22, 23]), ("[1, 2]", [31, 32, 33, 34, 35])])

    class Engine:
        def generate(self, request_id, prompt, params, resume=None):
            text, tokens = next(answers)

            async def outputs():
                yield RequestOutput(request_id, prompt, tokens, text, tokens, text, [], [], True, "stop", None, 0,
                                    0.0, 0.0)
            return outputs()

    structured = StructuredOutput("{}", "json_schema", json.dumps(COIN["json_schema"]["schema"]), ("uniqueItems",))
    keys = KeyRing({"k": KeyEntry(100, Tenant("t"))})
    drawn = []
    metrics = SimpleNamespace(structured_resamples="resamples", labels=lambda _: SimpleNamespace(
        inc=lambda: drawn.append(1)))
    params = SamplingParams(temperature=1.0, structured=structured)
    job = Job("r", [[1, 2]], [params], 1, key="k", state=SimpleNamespace(keys=keys, metrics=metrics))

    async def read():
        return [output async for output in job.outputs(Engine(), "r-0", [1, 2], params)]
    outputs = asyncio.run(read())
    assert [o.text for o in outputs] == ["[1, 2]"] and len(drawn) == 2
    # Charged so far: the two thrown-away answers' 4 + 3 tokens (the one sent is charged by the response, as before).
    assert keys.retry_after("k", 100 - 7) is None and keys.retry_after("k", 100 - 6) is not None


def test_a_seeded_requests_new_draws_have_their_own_reproducible_seeds():
    params = SamplingParams(seed=2**64 - 1, temperature=1)
    seeds = [resampled(params, attempt).seed for attempt in (1, 2)]
    assert len({params.seed, *seeds}) == 3 and all(0 <= seed < 2**64 for seed in seeds)
    assert seeds == [resampled(params, attempt).seed for attempt in (1, 2)]
    assert resampled(SamplingParams(temperature=1), 1).seed is None   # unseeded stays unseeded


def test_a_held_answer_that_validates_arrives_whole(client):
    chunks = list(client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}], n=3,
                                                 temperature=1.0, seed=5, max_tokens=32, response_format=HELD,
                                                 stream=True))
    texts = {}
    for chunk in chunks:
        for choice in chunk.choices:
            if choice.delta.content:
                assert choice.index not in texts, "a held answer comes in one piece"
                texts[choice.index] = choice.delta.content
    assert len(texts) == 3 and all(json.loads(text) == [1, 2] for text in texts.values())
