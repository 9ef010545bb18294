"""Structured output over schemas written by others (tests/support/schema_corpus.py: pydantic's schemas of the
official openai SDK's types, and SchemaStore's hand-written schemas, whole and definition by definition): each is
enforced, or refused with a 400 that says why (the keyword, unsatisfiable, or the library's limit), never an
error of another kind (measured: 2,883 of 3,080 enforced, 93.6%). The slow tier has the trained model answer a
sample: no finished answer that does not validate gets out (`answer_check`), and how many are answered validly is
printed and bounded."""
import collections
import re

import pytest

from kubeinfer.runtime.errors import InvalidRequestError
from kubeinfer.runtime.llm import LLM
from kubeinfer.runtime.sampling_params import SamplingParams
from kubeinfer.runtime.server.chat import render_chat
from kubeinfer.runtime.structured.answer_check import violation
from kubeinfer.runtime.structured.schema_check import json_schema_output
from support.schema_corpus import CorpusUnavailable, openai_schemas, schemastore_schemas

REFUSALS = re.compile(r"cannot enforce: \S|is unsatisfiable: \S|cannot be enforced: \S|invalid JSON schema at ")
# The default tier compiles every 20th pydantic schema and every 60th SchemaStore one (~150, ~25 s here;
# SchemaStore's are large: the meta-schema check alone takes 0.4 s on Azure Pipelines'); -m slow compiles all 3,080.
SAMPLE_EVERY = {"openai": 20, "schemastore": 60}


def corpus(every: dict[str, int]) -> dict[str, dict]:
    try:
        stored = schemastore_schemas(every["schemastore"])
    except CorpusUnavailable as error:
        pytest.skip(f"SchemaStore corpus unavailable: {error}")
    return {f"openai:{name}": schema for name, schema in openai_schemas(every["openai"]).items()} | {
        f"schemastore:{name}": schema for name, schema in stored.items()}


@pytest.fixture(scope="module")
def whole_corpus() -> dict[str, dict]:
    return corpus({"openai": 1, "schemastore": 1})


def compile_all(schemas: dict[str, dict]) -> tuple[dict, collections.Counter]:
    accepted, refused = {}, collections.Counter()
    for name, schema in schemas.items():
        try:
            accepted[name] = json_schema_output(schema, "schema")
        except InvalidRequestError as error:
            assert REFUSALS.search(str(error)), f"{name}: {error}"
            refused[str(error).split(": ", 1)[1][:70]] += 1
    return accepted, refused


def report(schemas, accepted, refused) -> None:
    print(f"\n{len(accepted)} of {len(schemas)} schemas enforced ({len(accepted) / len(schemas):.1%}); refused:")
    for reason, count in refused.most_common():
        print(f"  {count:4d}  {reason}")


def test_a_sample_of_the_corpus_is_enforced_or_refused_by_name():
    sample = corpus(SAMPLE_EVERY)
    accepted, refused = compile_all(sample)
    report(sample, accepted, refused)
    assert len(accepted) >= 0.9 * len(sample)


@pytest.mark.slow
@pytest.mark.timeout(3600)   # ~3,800 schemas; SchemaStore's definitions each carry their whole document
def test_the_whole_corpus_is_enforced_or_refused_by_name(whole_corpus):
    accepted, refused = compile_all(whole_corpus)
    report(whole_corpus, accepted, refused)
    assert len(accepted) >= 0.9 * len(whole_corpus)


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_the_trained_model_answers_a_sample_validly(whole_corpus, smollm2):
    """Every 40th enforced schema, asked for by its name; max_tokens 512, greedy."""
    accepted, _ = compile_all({name: whole_corpus[name] for name in sorted(whole_corpus)[::40]})
    names = sorted(accepted)
    with LLM(str(smollm2), kv_cache_memory_gib=1.0, max_model_len=2048) as llm:
        tokenizer = llm.tokenizer
        prompts = [render_chat(tokenizer.chat_template, [{"role": "user", "content": (
            f"Give one example of a {name.rsplit('.', 1)[-1].rsplit('/', 1)[-1]} as JSON.")}], True,
            tokenizer.bos_token, tokenizer.eos_token) for name in names]
        outputs = llm.generate(prompts, [SamplingParams(temperature=0, max_tokens=512, structured=accepted[name])
                                         for name in names])
    finished = {name: output for name, output in zip(names, outputs) if output.finish_reason == "stop"}
    broken = {name: violation(accepted[name], output.text) for name, output in finished.items()}
    broken = {name: reason for name, reason in broken.items() if reason is not None}
    print(f"\n{len(names)} schemas: {len(finished) - len(broken)} answered validly, {len(broken)} refused when "
          f"checked (held: 422), {len(names) - len(finished)} cut by max_tokens")
    assert all(accepted[name].held for name in broken), broken   # only an approximated keyword may fail the check
    # Measured: 73 schemas, 54 answered validly, 1 refused when checked, 18 cut by max_tokens (53 / 1 / 19 before
    # free-form numbers were bounded, 49 / 1 / 23 before the repeated-key guard, 43 / 1 / 29 before the string guard,
    # 20 / 0 / 53 before the loop guard; the cut ones invent keys, count in lists or nest free-form objects in
    # themselves: the 135M model rambles): a floor, not the 90% goal.
    assert len(finished) - len(broken) >= 0.65 * len(names)
