"""`previous_response_id` on the real trained SmolLM2-135M-Instruct (the trained-model tier, tests/support/
trained_model.py) with the official openai client: the second turn answers from the first, which only the stored
conversation can tell it; the prefix cache serves the first turn's prompt again (usage says so)."""
import openai
import pytest

NAME = "Zorblat"
CUE = NAME[:5]   # a made-up name: only the stored turn can put it in the answer (the 135M model may end it otherwise)


@pytest.fixture(scope="module")
def client(smollm2, start_server):
    with start_server(smollm2, max_model_len=2048, kv_cache_memory_gib=0.5) as (url, _):
        yield openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=300)


def test_the_second_turn_answers_from_the_stored_first(client):
    first = client.responses.create(model="tiny", input=f"Hello! My name is {NAME}. Please remember my name.",
                                    temperature=0, max_output_tokens=48)
    assert first.output_text
    second = client.responses.create(model="tiny", input="What is my name?", previous_response_id=first.id,
                                     temperature=0, max_output_tokens=24)
    alone = client.responses.create(model="tiny", input="What is my name?", temperature=0, max_output_tokens=24)
    assert CUE in second.output_text, second.output_text
    assert CUE not in alone.output_text, alone.output_text   # without the stored turn the model cannot know it
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
    assert second.usage.input_tokens_details.cached_tokens > 0   # the first turn's prompt, from the prefix cache
