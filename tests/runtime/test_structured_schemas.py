"""What the grammar of a JSON schema enforces (runtime/structured/enforceable.py, json_layout.py, schema_check.py)
and how a finished answer is checked (answer_check.py): keyword by keyword, through llguidance matchers on the test
model's tokenizer and the jsonschema reference validator."""
import json

import jsonschema
import llguidance
import pytest

from kubeinfer.runtime.errors import InvalidRequestError
from kubeinfer.runtime.structured.answer_check import violation
from kubeinfer.runtime.structured.enforceable import (CHECKED_AFTER, FRACTION_DIGITS, INTEGER_DIGITS, Unsatisfiable,
                                                       enforceable, free_value)
from kubeinfer.runtime.structured.json_layout import INDENT, MAX_LEVELS, nesting
from kubeinfer.runtime.structured.schema_check import json_schema_output

OBJECT = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


@pytest.fixture(scope="module")
def tokenizer(llama_dir):
    return llguidance.LLTokenizer((llama_dir / "tokenizer.json").read_text(), n_vocab=512, eos_token=[0])


def accepts(tokenizer, schema, text: str) -> bool:
    """Whether the grammar schema_check builds for `schema` accepts `text` whole."""
    matcher = llguidance.LLMatcher(tokenizer, json_schema_output(schema, "schema").grammar, log_level=0)
    tokens = tokenizer.tokenize_str(text)
    return matcher.validate_tokens(tokens) == len(tokens) and matcher.consume_tokens(tokens) and \
        matcher.is_accepting()


@pytest.mark.parametrize("keyword, value", [
    ("not", {"type": "string"}), ("if", {"required": ["a"]}), ("uniqueItems", True),
    ("propertyNames", {"maxLength": 3}), ("dependentRequired", {"a": ["b"]}),
    ("dependentSchemas", {"a": {"required": ["b"]}}), ("contains", {"type": "integer"})])
def test_keywords_a_grammar_cannot_express_are_dropped_and_named(keyword, value):
    schema = {"type": "array" if keyword in ("uniqueItems", "contains") else "object", keyword: value}
    grammar_schema, approximated = enforceable(schema)
    assert keyword in approximated and keyword not in grammar_schema and keyword in CHECKED_AFTER
    assert json_schema_output(schema, "p").approximated == approximated


def test_an_over_approximation_keeps_every_valid_answer(tokenizer):
    schema = {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "uniqueItems": True,
              "contains": {"const": 3}, "minContains": 2, "maxItems": 4}
    grammar_schema, _ = enforceable(schema)
    assert grammar_schema["minItems"] == 2   # what minContains needs, enforced while writing
    for text in ("[3,3]", "[1,3,3]", "[3, 3, 4]"):
        assert accepts(tokenizer, schema, text), text
    assert not accepts(tokenizer, schema, "[3]")


def test_unsatisfiable_schemas_are_refused_as_such():
    for schema in (False, {"not": {}}, {"type": "integer", "minimum": 5, "maximum": 1}, {"enum": []}):
        with pytest.raises(InvalidRequestError, match="unsatisfiable"):
            json_schema_output(schema, "response_format.json_schema.schema")
    with pytest.raises(Unsatisfiable):
        enforceable({"not": True})
    # Below the root, a value that excludes everything is a property that cannot appear: exactly `false`.
    grammar_schema, approximated = enforceable({"type": "object", "properties": {"x": {"not": {}}}})
    assert grammar_schema["properties"]["x"] is False and approximated == ()


def test_a_keyword_nothing_enforces_is_refused_by_name():
    schema = {"$dynamicAnchor": "node", "type": "object", "properties": {"child": {"$dynamicRef": "#node"}}}
    with pytest.raises(InvalidRequestError, match=r"cannot enforce: \$dynamicAnchor"):
        json_schema_output(schema, "schema")


def test_unevaluated_keywords_are_exact_without_in_place_applicators():
    exact, approximated = enforceable({"type": "object", "properties": {"a": {}}, "unevaluatedProperties": False})
    assert exact["additionalProperties"] is False and approximated == ()
    items, _ = enforceable({"type": "array", "prefixItems": [{}], "unevaluatedItems": False})
    assert items["items"] is False
    composed, approximated = enforceable({"allOf": [OBJECT], "unevaluatedProperties": False})
    assert "additionalProperties" not in composed and approximated == ("unevaluatedProperties",)


def test_one_of_the_library_cannot_prove_exclusive_is_approximated(tokenizer):
    schema = {"oneOf": [{"type": "number"}, {"type": "integer"}]}
    assert json_schema_output(schema, "p").approximated == ("oneOf",)
    exclusive = {"oneOf": [{"type": "string"}, {"type": "integer"}]}
    assert json_schema_output(exclusive, "p").approximated == ()


def test_unknown_formats_are_annotations_and_known_ones_are_enforced(tokenizer):
    unknown, _ = enforceable({"type": "string", "format": "uri-reference"})
    assert "format" not in unknown
    dated = {"type": "object", "properties": {"d": {"type": "string", "format": "date"}}, "required": ["d"]}
    assert accepts(tokenizer, dated, '{"d": "2024-07-26"}')
    assert not accepts(tokenizer, dated, '{"d": "26 July"}')


def test_numbers_have_bounded_digits(tokenizer):
    schema = {"type": "object", "properties": {"x": {"type": "number"}, "n": {"type": "integer"}},
              "required": ["x", "n"]}
    fraction = "1." + "1" * FRACTION_DIGITS
    assert accepts(tokenizer, schema, f'{{"x": {fraction}, "n": -12}}')
    assert not accepts(tokenizer, schema, f'{{"x": {fraction}1, "n": 1}}')
    assert not accepts(tokenizer, schema, f'{{"x": 1, "n": 1{"0" * INTEGER_DIGITS}}}')
    ranged = {"type": "number", "maximum": 100, "minimum": 0}   # the schema's own bounds stay as they are
    assert enforceable(ranged)[0] == dict(ranged, multipleOf=10.0 ** -FRACTION_DIGITS)
    assert enforceable({"type": "number", "multipleOf": 0.5, "enum": [0.5, 1]})[0].get("minimum") is None


def test_objects_get_no_properties_the_schema_does_not_name_unless_composed():
    closed, _ = enforceable({"type": "object", "properties": {"a": OBJECT}})
    assert closed["additionalProperties"] is False and closed["properties"]["a"]["additionalProperties"] is False
    for schema in ({"allOf": [OBJECT, {"properties": {"b": {}}}]}, dict(OBJECT, additionalProperties=True),
                   dict(OBJECT, patternProperties={"^x": {}}), dict(OBJECT, anyOf=[{"required": ["b"]}]),
                   dict(OBJECT, dependentSchemas={"a": {"properties": {"b": {}}}})):
        rewritten, _ = enforceable(schema)
        assert rewritten.get("additionalProperties") in (None, free_value()), schema
    # free-form objects stay free: any key, any value (its numbers bounded: test_free_form_values_have_bounded_numbers)
    assert enforceable({"type": "object"})[0] == {"type": "object", "additionalProperties": free_value()}


def test_free_form_values_have_bounded_numbers(tokenizer):
    """A value nothing describes ({}, true, an object's or array's undescribed members) is any JSON value, and a number
    in it gets a described number's bounds: greedy, SmolLM2 wrote `"id": 1234567890123...` to max_tokens there."""
    big = "1" + "0" * INTEGER_DIGITS
    for schema in ({"type": "object", "additionalProperties": True}, {"type": "object"},
                   {"type": "object", "properties": {"a": {}}, "required": ["a"], "additionalProperties": False},
                   {"type": "object", "properties": {"a": {"description": "anything"}}, "required": ["a"]}):
        for value in ('"text"', "[1, {}]", '{"b": null}', "true", "-12.5"):   # any JSON value, as before
            assert accepts(tokenizer, schema, f'{{"a": {value}}}'), (schema, value)
        assert not accepts(tokenizer, schema, f'{{"a": {big}}}'), schema
        assert not accepts(tokenizer, schema, '{"a": 1.' + "1" * (FRACTION_DIGITS + 1) + "}"), schema
    items = {"type": "array"}
    assert accepts(tokenizer, items, '["x", 1, [2]]') and not accepts(tokenizer, items, f"[{big}]")
    assert accepts(tokenizer, True, "[1, 2]") and not accepts(tokenizer, True, big)   # the whole answer free-form
    # one level only: the numbers inside a free-form object or array stay unbounded (the grammars of large schemas
    # would outgrow the library's limit)
    assert accepts(tokenizer, {"type": "object"}, f'{{"a": [{big}]}}')


def test_nesting_depth_bounds_the_indentation(tokenizer):
    flat, nested = OBJECT, {"type": "object", "properties": {"a": {"type": "array", "items": OBJECT}}}
    recursive = {"$defs": {"n": {"type": "object", "properties": {"c": {"$ref": "#/$defs/n"}}}}, "$ref": "#/$defs/n"}
    depth = [nesting(grammar_schema, grammar_schema) for grammar_schema, _ in map(enforceable, (flat, nested, recursive))]
    assert depth == [1, 3, MAX_LEVELS]
    assert nesting({"type": "object"}, {}) == MAX_LEVELS   # a free-form value may go as deep as it likes
    value = {"a": [{"a": 1}, {"a": 2}]}
    for text in (json.dumps(value), json.dumps(value, indent=2), json.dumps(value, indent=4),
                 json.dumps(value, indent="\t")):   # the layouts models write
        assert accepts(tokenizer, nested, text), text
    widest = " " * (INDENT * 4)   # depth 3, plus one level
    assert accepts(tokenizer, nested, '{"a": [\n' + widest + '{"a": 1}]}')
    assert not accepts(tokenizer, nested, '{"a": [\n' + widest + ' {"a": 1}]}')
    assert not accepts(tokenizer, nested, '{"a":\n\n[]}')   # one newline per gap
    assert not accepts(tokenizer, nested, ' {"a": []}') and not accepts(tokenizer, nested, '{"a": []}\n')


def test_a_finished_answer_is_checked_against_the_users_schema():
    output = json_schema_output({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, "p")
    assert output.held and violation(output, "[1, 2]") is None
    assert "uniqueItems" in violation(output, "[1, 1]")
    assert "not JSON" in violation(output, "[1,")
    assert "/1" in violation(json_schema_output({"type": "array", "items": {"type": "integer"}}, "p"), '[1, "x"]')
    assert not json_schema_output(OBJECT, "p").held
    jsonschema.validate([1, 2], json.loads(output.schema))   # the user's schema travels unchanged
