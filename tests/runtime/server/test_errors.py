"""Bad requests get OpenAI's error body and the right status, never a 5xx."""
import json
import threading

import httpx
import openai
import pytest

from support import wait_for

MODEL = "tiny"


def post(url: str, path: str, body, **kwargs) -> httpx.Response:
    content = body if isinstance(body, (str, bytes)) else json.dumps(body)
    return httpx.post(url + path, content=content, headers={"content-type": "application/json",
                                                            **kwargs.pop("headers", {})}, timeout=30, **kwargs)


def assert_error(response: httpx.Response, status: int, param: str | None = None, text: str = ""):
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    if param is not None:
        assert error["param"] == param
    assert text.lower() in error["message"].lower()


@pytest.mark.parametrize("body, status, param, text", [
    ("{not json", 400, None, "not valid JSON"),
    ({"prompt": "x"}, 400, "model", "field required"),
    ({"model": "other", "prompt": "x"}, 404, "model", "not served"),
    ({"model": MODEL, "prompt": "x", "top_p": 2}, 400, "top_p", "top_p"),
    ({"model": MODEL, "prompt": "x", "temperature": -1}, 400, "temperature", "temperature"),
    ({"model": MODEL, "prompt": "x", "n": 0}, 400, "n", ""),
    ({"model": MODEL, "prompt": "x", "max_tokens": 0}, 400, "max_tokens", "max_tokens"),
    ({"model": MODEL, "prompt": "x", "max_tokens": 10_000}, 400, "max_tokens", "exceeds"),
    ({"model": MODEL, "prompt": "word " * 300}, 400, "prompt", "at most 256 tokens"),
    ({"model": MODEL, "prompt": [999_999]}, 400, "prompt", "token ids"),
    ({"model": MODEL, "prompt": ""}, 400, "prompt", "empty"),
    ({"model": MODEL, "prompt": "x", "echo": True}, 400, "echo", "not supported"),
    ({"model": MODEL, "prompt": "x", "logprobs": 99}, 400, "logprobs", "logprobs"),
    ({"model": MODEL, "prompt": "x", "logit_bias": {"99999": 1}}, 400, "logit_bias", "token ids must be in"),
    ({"model": MODEL, "prompt": "x", "logit_bias": {"five": 1}}, 400, "logit_bias", "integers"),
    ({"model": MODEL, "prompt": "x", "logit_bias": {"5": 101}}, 400, "logit_bias", "[-100, 100]"),
    ({"model": MODEL, "prompt": "x", "stop_token_ids": [99999]}, 400, "stop_token_ids", "token ids must be in"),
])
def test_completion_errors(server, body, status, param, text):
    url, state = server
    before = state.engine.num_in_flight
    assert_error(post(url, "/v1/completions", body), status, param, text)
    assert state.engine.num_in_flight == before


@pytest.mark.parametrize("body, param, text", [
    ({"model": MODEL, "messages": []}, "messages", ""),
    ({"model": MODEL, "messages": [{"role": "wizard", "content": "x"}]}, None, "role"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}, "tools[0]",
     "name"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}, "top_logprobs", ""),
    ({"model": MODEL, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "what is this?"}, {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]},
     "messages", "messages[0]: a content part of type 'image_url' is not supported; this server takes text only"),
    ({"model": MODEL, "messages": [{"role": "system", "content": "be brief"},
                                   {"role": "user", "content": [{"type": "text"}]}]},
     "messages", "messages[1]: a content part of type 'text' needs a 'text' field"),
])
def test_chat_errors(server, body, param, text):
    url, _ = server
    assert_error(post(url, "/v1/chat/completions", body), 400, param, text)


def test_unknown_route_and_method(server):
    url, _ = server
    assert_error(httpx.get(url + "/v1/nothing"), 404)
    assert_error(httpx.get(url + "/v1/completions"), 405)


def test_errors_are_counted_by_status(server):
    url, _ = server
    post(url, "/v1/completions", {"model": "nope", "prompt": "x"})
    metrics = httpx.get(url + "/metrics").text
    assert 'kubeinfer_request_errors_total{model_name="tiny",status_code="404"}' in metrics


def test_openai_client_raises_the_matching_exceptions(server):
    url, _ = server
    client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=MODEL, prompt="x", top_p=3)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="gpt-4", prompt="x")


def test_api_keys_and_token_quota(llama_dir, tmp_path, start_server):
    keys = tmp_path / "keys"
    keys.write_text("# team keys\nopen-key\nsmall-key 40\n")
    with start_server(llama_dir, api_keys_file=str(keys), max_model_len=256) as (url, _):
        body = {"model": MODEL, "prompt": "hello there", "max_tokens": 4}
        assert_error(post(url, "/v1/completions", body), 401, text="API key")
        assert_error(post(url, "/v1/completions", body, headers={"authorization": "Bearer wrong"}), 401)
        assert_error(httpx.get(url + "/v1/models"), 401)
        assert post(url, "/v1/completions", body, headers={"authorization": "Bearer open-key"}).status_code == 200
        assert httpx.get(url + "/health").status_code == 200 and httpx.get(url + "/metrics").status_code == 200
        small = {"authorization": "Bearer small-key"}
        statuses = [post(url, "/v1/completions", body, headers=small) for _ in range(6)]
        codes = [r.status_code for r in statuses]
        assert codes[0] == 200 and 429 in codes
        refused = statuses[codes.index(429)]
        assert_error(refused, 429, text="quota")
        assert 1 <= int(refused.headers["retry-after"]) <= 60
        client = openai.OpenAI(base_url=url + "/v1", api_key="wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            client.models.list()


def test_full_queue_gives_429_with_retry_after(llama_dir, start_server, monkeypatch):
    # Room for 2 requests (1 running + 1 waiting); 16 arrive at once. The engine's steps are held (a gate between
    # steps, the engine on a thread) until every request is refused or admitted: the admitted stay in flight however
    # fast the engine is, so the queue is full for the rest. Exactly 2 are admitted: room is reserved when checked.
    from kubeinfer.runtime.engine.core import EngineCore
    gate, step = threading.Event(), EngineCore.step
    monkeypatch.setattr(EngineCore, "step", lambda core: gate.wait() and step(core))
    with start_server(llama_dir, max_model_len=256, max_num_seqs=1, max_waiting_requests=1,
                      engine_mode="thread") as (url, state):
        body = {"model": MODEL, "prompt": "x", "max_tokens": 100, "ignore_eos": True}
        responses, barrier = [None] * 16, threading.Barrier(16)

        def send(i):
            barrier.wait()
            responses[i] = post(url, "/v1/completions", body)

        threads = [threading.Thread(target=send, args=(i,)) for i in range(16)]
        try:
            for thread in threads:
                thread.start()
            wait_for(lambda: sum(r is not None for r in responses) + state.admitted == 16, 60,
                     "every request to be refused or admitted")
            assert state.admitted == 2
        finally:
            gate.set()
        for thread in threads:
            thread.join()
        codes = sorted(r.status_code for r in responses)
        assert codes.count(200) == 2 and codes.count(429) == 14
        for refused in (r for r in responses if r.status_code == 429):
            assert_error(refused, 429, text="capacity")
            assert refused.headers["retry-after"] == "1"
        for done in (r for r in responses if r.status_code == 200):
            assert done.json()["usage"]["completion_tokens"] == 100
        assert state.admitted == 0
        assert state.engine.num_in_flight == 0


def test_streams_arriving_together_never_pass_the_capacity_and_give_their_room_back(llama_dir, start_server,
                                                                                     monkeypatch):
    """Streamed requests register with the engine only when their body starts: their room is reserved at
    admission all the same. The room comes back however a stream ends: read to the end, or its client gone
    before reading a byte."""
    from kubeinfer.runtime.engine.core import EngineCore
    gate, step = threading.Event(), EngineCore.step
    monkeypatch.setattr(EngineCore, "step", lambda core: gate.wait() and step(core))
    with start_server(llama_dir, max_model_len=256, max_num_seqs=1, max_waiting_requests=2,
                      engine_mode="thread") as (url, state):
        body = json.dumps({"model": MODEL, "prompt": "x", "max_tokens": 20, "ignore_eos": True, "stream": True})
        client = httpx.Client(timeout=60)
        statuses, streams, barrier = [None] * 12, [None] * 12, threading.Barrier(12)

        def send(i):
            barrier.wait()
            request = client.build_request("POST", url + "/v1/completions", content=body,
                                           headers={"content-type": "application/json"})
            streams[i] = client.send(request, stream=True)
            statuses[i] = streams[i].status_code

        threads = [threading.Thread(target=send, args=(i,)) for i in range(12)]
        try:
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            assert sorted(statuses).count(200) == 3 and statuses.count(429) == 9
            assert state.admitted == 3
            admitted = [s for s in streams if s.status_code == 200]
            admitted[0].close()   # gone before reading a byte
        finally:
            gate.set()
        for stream in admitted[1:]:
            assert b"data: [DONE]" in stream.read()
            stream.close()
        wait_for(lambda: state.admitted == 0 and state.engine.num_in_flight == 0, 60, "every stream's room back")
        assert post(url, "/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 2}).status_code == 200
        client.close()
