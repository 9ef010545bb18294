"""Structured output through the real server (the engine in its own process) with the official openai client: with
the random-weight model, every output parses and validates against its schema (jsonschema, the reference
validator), finishes by itself within a modest max_tokens, and carries no whitespace between JSON tokens.
Bounded schemas only: a `number` has no bound on its digits, and greedy random weights were seen to loop on them."""
import json
import re
from typing import Literal

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

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
    friends: list[str] = Field(max_length=2)


@pytest.fixture(scope="module")
def client(server):
    url, _ = server
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)


def assert_valid_compact(text: str, schema: dict) -> None:
    jsonschema.validate(json.loads(text), schema)
    assert not re.search(r"\s", STRINGS.sub('""', text)), f"whitespace between JSON tokens: {text!r}"


def test_every_sampled_output_validates_and_finishes(client):
    chat = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "a person"}], n=12,
                                          temperature=1.0, seed=7, max_tokens=160, response_format=FORMAT)
    completion = client.completions.create(model=MODEL, prompt="a person:", n=4, temperature=1.0, seed=1,
                                           max_tokens=160, extra_body={"response_format": FORMAT})
    texts = [c.message.content for c in chat.choices] + [c.text for c in completion.choices]
    assert [c.finish_reason for c in chat.choices + completion.choices] == ["stop"] * 16
    for text in texts:
        assert_valid_compact(text, SCHEMA)
    assert len(set(texts)) > 1   # sampled, not one forced answer


def test_streamed_greedy_output_equals_the_whole_one(client):
    messages = [{"role": "user", "content": "a person"}]
    whole = client.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=160,
                                           response_format=FORMAT)
    chunks = list(client.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=160,
                                                 response_format=FORMAT, stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text == whole.choices[0].message.content
    assert_valid_compact(text, SCHEMA)


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


def test_parse_with_a_pydantic_model(client):
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
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "array", "uniqueItems": True}}},
     "response_format.json_schema.schema", "uniqueItems"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "not": {"required": ["a"]}}}},
     "response_format.json_schema.schema", "not"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "properties": {"age": {"type": "strin"}}}}},
     "response_format.json_schema.schema", "properties.age.type"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string", "maxLength": -1}}},
     "response_format.json_schema.schema", "maxLength"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string", "format": "colour"}}},
     "response_format.json_schema.schema", "colour"),
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
    bad = {"format": {"type": "json_schema", "name": "x", "schema": {"type": "array", "contains": {}}}}
    reply = httpx.post(f"{url}/v1/responses", json={"model": MODEL, "input": "x", "text": bad})
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "text.format.schema"
    assert "contains" in reply.json()["error"]["message"]
    for extra, param in (({"ignore_eos": True}, "ignore_eos"), ({"min_tokens": 2}, "min_tokens")):
        reply = httpx.post(f"{url}/v1/chat/completions", json={
            "model": MODEL, "messages": [{"role": "user", "content": "x"}], "response_format": FORMAT} | extra)
        assert reply.status_code == 400 and reply.json()["error"]["param"] == param, reply.text
