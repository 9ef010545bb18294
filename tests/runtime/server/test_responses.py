"""`/v1/responses` with the official openai client against a real server (the engine in its own process)."""
import openai
import pytest

from kubeinfer.runtime.llm import LLM
from kubeinfer.runtime.sampling_params import SamplingParams
from kubeinfer.runtime.server.responses_store import ResponseStore, StoredResponse

MODEL = "tiny"
EXTRA = {"ignore_eos": True}
EVENT_ORDER = ["response.created", "response.in_progress", "response.output_item.added",
               "response.content_part.added", "response.output_text.delta", "response.output_text.done",
               "response.content_part.done", "response.output_item.done", "response.completed"]


@pytest.fixture(scope="module")
def client(server):
    url, _ = server
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def offline(llama_dir):
    return LLM(str(llama_dir), max_model_len=256)


def chatml(*turns: tuple[str, str]) -> str:
    return "".join(f"<|im_start|>{role}\n{text}<|im_end|>\n" for role, text in turns) + "<|im_start|>assistant\n"


def test_create_equals_the_chat_completion_of_the_same_messages(client):
    response = client.responses.create(model=MODEL, input="What is a pod?", instructions="be brief",
                                       max_output_tokens=12, temperature=0, extra_body=EXTRA)
    chat = client.chat.completions.create(model=MODEL, max_tokens=12, temperature=0, extra_body=EXTRA, messages=[
        {"role": "system", "content": "be brief"}, {"role": "user", "content": "What is a pod?"}])
    assert response.output_text == chat.choices[0].message.content and response.output_text
    assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"
    assert response.usage.input_tokens == chat.usage.prompt_tokens
    assert response.usage.output_tokens == 12 and response.usage.total_tokens == chat.usage.total_tokens
    assert response.id.startswith("resp_") and response.output[0].role == "assistant"
    # message items with text parts, as the SDK sends them, render the same prompt
    items = client.responses.create(model=MODEL, max_output_tokens=12, temperature=0, extra_body=EXTRA, input=[
        {"role": "developer", "content": "be brief"},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "What is a pod?"}]}])
    assert items.usage.input_tokens == response.usage.input_tokens


def _stop_token(offline: LLM, prompt: str) -> int:
    """A token the greedy answer produces a few tokens in: the request ends there, status completed."""
    [greedy] = offline.generate([offline.tokenizer.encode(prompt, add_special_tokens=False)],
                                SamplingParams(max_tokens=12, temperature=0, ignore_eos=True))
    return greedy.token_ids[5]


def test_stream_sends_the_events_in_order_and_the_whole_text(client, offline):
    extra = {"stop_token_ids": [_stop_token(offline, chatml(("user", "Tell me about nodes")))]}
    whole = client.responses.create(model=MODEL, input="Tell me about nodes", temperature=0, extra_body=extra)
    assert whole.status == "completed" and whole.incomplete_details is None
    events = list(client.responses.create(model=MODEL, input="Tell me about nodes", temperature=0, stream=True,
                                          extra_body=extra))
    kinds = [event.type for event in events]
    assert [kind for i, kind in enumerate(kinds) if i == 0 or kind != kinds[i - 1]] == EVENT_ORDER
    assert [event.sequence_number for event in events] == list(range(len(events)))
    deltas = "".join(event.delta for event in events if event.type == "response.output_text.delta")
    done = next(event for event in events if event.type == "response.output_text.done")
    assert deltas == done.text == whole.output_text
    final = events[-1].response
    assert final.status == "completed" and final.output[0].content[0].text == whole.output_text
    assert final.usage.output_tokens == whole.usage.output_tokens and final.usage.input_tokens == whole.usage.input_tokens
    with client.responses.stream(model=MODEL, input="Tell me about nodes", temperature=0, extra_body=extra) as stream:
        text = "".join(event.delta for event in stream if event.type == "response.output_text.delta")
        assert stream.get_final_response().output_text == text == whole.output_text


def test_previous_response_id_continues_the_stored_conversation(client, offline):
    first = client.responses.create(model=MODEL, input="Name a fruit", max_output_tokens=6, temperature=0,
                                    extra_body=EXTRA)
    second = client.responses.create(model=MODEL, input="And a colour?", previous_response_id=first.id,
                                     max_output_tokens=6, temperature=0, extra_body=EXTRA)
    prompt = chatml(("user", "Name a fruit"), ("assistant", first.output_text), ("user", "And a colour?"))
    assert second.usage.input_tokens == len(offline.tokenizer.encode(prompt, add_special_tokens=False))
    chat = client.chat.completions.create(model=MODEL, max_tokens=6, temperature=0, extra_body=EXTRA, messages=[
        {"role": "user", "content": "Name a fruit"}, {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "And a colour?"}])
    assert second.output_text == chat.choices[0].message.content
    assert client.responses.retrieve(first.id).output_text == first.output_text
    client.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError) as refused:
        client.responses.create(model=MODEL, input="again", previous_response_id=first.id, max_output_tokens=2)
    assert refused.value.body["param"] == "previous_response_id" and refused.value.body["code"] == "not_found"
    assert refused.value.body["type"] == "not_found_error"
    unstored = client.responses.create(model=MODEL, input="x", store=False, max_output_tokens=2)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)


@pytest.mark.parametrize("fields, param", [
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x"}]}]}, "input"),
    ({"input": [{"type": "reasoning", "summary": []}]}, "input"),
    ({"input": []}, "input"),
    ({"background": True}, "background"),
    ({"reasoning": {"effort": "high"}}, "reasoning"),
    ({"include": ["message.output_text.logprobs"]}, "include"),
    ({"truncation": "auto"}, "truncation"),
    ({"max_output_tokens": 0}, "max_output_tokens"),
])
def test_bad_input_is_a_400_naming_the_param(client, fields, param):
    body = {"model": MODEL, "input": "hi"} | fields
    with pytest.raises(openai.BadRequestError) as refused:
        client.post("/responses", body=body, cast_to=object)
    assert refused.value.status_code == 400 and refused.value.body["param"] == param, refused.value.body


def test_the_store_keeps_the_newest_responses():
    store = ResponseStore(capacity=2)
    for name in "abc":
        store.put(name, StoredResponse({"id": name}, [], "t"))
        if name == "b":
            store.get("a", "t")   # used: kept over b
    assert store.get("b", "t") is None and store.get("a", "t") is not None and store.get("c", "t") is not None
    assert len(store) == 2


def test_a_response_expires_and_is_its_tenant_s_alone():
    now = [0.0]
    store = ResponseStore(capacity=10, ttl_s=60, clock=lambda: now[0])
    store.put("a", StoredResponse({"id": "a"}, [], "alpha"))
    assert store.get("a", "beta") is None and not store.delete("a", "beta")   # another tenant: as if unknown
    now[0] = 60.0
    assert store.get("a", "alpha") is not None
    now[0] = 60.5
    assert store.get("a", "alpha") is None and len(store) == 0   # expired: dropped


def test_an_unknown_previous_response_is_a_404_naming_it(client):
    with pytest.raises(openai.NotFoundError) as refused:
        client.responses.create(model=MODEL, input="hi", previous_response_id="resp_unknown", max_output_tokens=2)
    assert refused.value.body["param"] == "previous_response_id" and refused.value.body["code"] == "not_found"


def test_one_tenant_never_reads_continues_or_deletes_another_s_response(llama_dir, start_server, tmp_path):
    keys = tmp_path / "keys"
    keys.write_text("alpha-key tenant=alpha\nbeta-key tenant=beta\n")
    with start_server(llama_dir, str(keys), max_model_len=256) as (url, _):
        alpha, beta = (openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0)
                       for key in ("alpha-key", "beta-key"))
        plan = "A secret plan: " + "pods and nodes and replicas, " * 8
        first = alpha.responses.create(model=MODEL, input=plan, max_output_tokens=4, temperature=0, extra_body=EXTRA)
        with pytest.raises(openai.NotFoundError):
            beta.responses.retrieve(first.id)
        with pytest.raises(openai.NotFoundError):
            beta.responses.create(model=MODEL, input="Go on", previous_response_id=first.id, max_output_tokens=2)
        with pytest.raises(openai.NotFoundError):
            beta.responses.delete(first.id)
        assert alpha.responses.retrieve(first.id).output_text == first.output_text   # still there, for alpha
        second = alpha.responses.create(model=MODEL, input="Go on", previous_response_id=first.id,
                                        max_output_tokens=2, temperature=0, extra_body=EXTRA)
        assert second.usage.input_tokens > first.usage.input_tokens
        # The continuation's prompt starts with the first turn's: the prefix cache serves it (to alpha alone).
        assert second.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens // 2
