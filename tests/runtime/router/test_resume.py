"""Resuming a stream: the router's reading of the replica's progress lines, and a replica continuing a stream."""
import json

import httpx
import pytest

from kubeinfer.runtime.router.resume import StreamProgress, is_resumable

EVENTS = [b": ki-id cmpl-1 1700000000\n\n", b': ki 5 17 42\ndata: {"text": "hello"}\n\n', b": ki 5 9\n\n",
          b': ki 11 3\ndata: {"text": " world"}\n\n', b"data: [DONE]\n\n"]


@pytest.mark.parametrize("cut", [1, 7, 64])
def test_progress_lines_are_read_and_stripped_whatever_the_chunking(cut):
    stream = b"".join(EVENTS)
    progress, relayed = StreamProgress(), b""
    for start in range(0, len(stream), cut):
        relayed += progress.feed(stream[start:start + cut])
    assert relayed == b'data: {"text": "hello"}\n\ndata: {"text": " world"}\n\ndata: [DONE]\n\n'
    assert (progress.id, progress.created, progress.token_ids, progress.text_chars) == ("cmpl-1", 1700000000,
                                                                                        [17, 42, 9, 3], 11)
    assert progress.done and not progress.resumable


def test_progress_counts_only_whole_events():
    """An event cut by the replica's death is neither relayed nor counted: the continuation sends it again."""
    progress = StreamProgress()
    assert progress.feed(EVENTS[0] + EVENTS[1] + EVENTS[3][:12]) == b'data: {"text": "hello"}\n\n'
    assert progress.token_ids == [17, 42] and progress.text_chars == 5 and progress.resumable
    body = json.loads(progress.resume_body({"model": "m", "prompt": "p", "stream": True}))
    assert body["kubeinfer_resume"] == {"id": "cmpl-1", "created": 1700000000, "token_ids": [17, 42],
                                        "text_chars": 5}
    assert body["prompt"] == "p"


@pytest.mark.parametrize("path, body, expected", [
    ("/v1/completions", {"prompt": "a", "stream": True}, True),
    ("/v1/completions", {"prompt": [1, 2, 3], "stream": True, "n": 1}, True),
    ("/v1/chat/completions", {"messages": [], "stream": True}, True),
    ("/v1/completions", {"prompt": "a"}, False),                             # not a stream
    ("/v1/completions", {"prompt": "a", "stream": True, "n": 2}, False),     # two choices
    ("/v1/completions", {"prompt": ["a", "b"], "stream": True}, False),      # a batch of prompts
    ("/v1/responses", {"input": "a", "stream": True}, False),
])
def test_which_requests_are_resumable(path, body, expected):
    assert is_resumable(path, body) is expected


def progress_stream(url: str, body: dict) -> tuple[list[int], list[int], str, str]:
    """A stream straight from a replica with the router's header: (token ids, characters sent after each
    output, the text, the id)."""
    ids, chars, text, stream_id = [], [], "", None
    with httpx.stream("POST", url + "/v1/completions", json=body, headers={"x-kubeinfer-resumable": "1"},
                      timeout=60) as response:
        for line in response.iter_lines():
            if line.startswith(": ki-id "):
                stream_id = line.split()[2]
            elif line.startswith(": ki "):
                _, _, sent, *new = line.split()
                ids += map(int, new)
                chars.append((len(ids), int(sent)))
            elif line.startswith("data: {"):
                event = json.loads(line[6:])
                assert event["id"] == stream_id
                text += event["choices"][0]["text"] if event["choices"] else ""
    return ids, chars, text, stream_id


def test_a_replica_continues_a_stream_from_any_point_with_the_same_text(replicas):
    """Cut the replica's own stream after k outputs (a stop string holds text back), resume it with the tokens and
    characters the client had: the text sent before plus the continuation is the whole text, under the same id."""
    body = {"model": "tiny", "prompt": "Kubernetes", "max_tokens": 60, "temperature": 0, "ignore_eos": True,
            "stream": True, "stop": ["never said"]}
    ids, chars, text, stream_id = progress_stream(replicas[0].url, body)
    assert len(ids) == 60 and text
    for num_tokens, sent in chars[::7]:
        resume = {"id": stream_id, "created": 1, "token_ids": ids[:num_tokens], "text_chars": sent}
        more_ids, _, more_text, more_id = progress_stream(replicas[1].url, body | {"kubeinfer_resume": resume})
        assert more_id == stream_id and ids[:num_tokens] + more_ids == ids
        assert text[:sent] + more_text == text


@pytest.mark.parametrize("change, message", [
    ({"stream": False}, "stream true, n 1"),
    ({"n": 2}, "stream true, n 1"),
    ({"kubeinfer_resume": {"id": "x", "created": 1, "token_ids": [1] * 8, "text_chars": 0}}, "nothing is left"),
    ({"kubeinfer_resume": {"id": "x", "created": 1, "token_ids": [10**9], "text_chars": 0}}, "token ids must be"),
    ({"kubeinfer_resume": {"id": "x", "created": 1, "token_ids": [5], "text_chars": -1}}, "text_chars"),
])
def test_a_bad_resume_is_a_400_naming_it(replicas, change, message):
    body = {"model": "tiny", "prompt": "Kubernetes", "max_tokens": 8, "stream": True,
            "kubeinfer_resume": {"id": "x", "created": 1, "token_ids": [5], "text_chars": 0}} | change
    response = httpx.post(replicas[0].url + "/v1/completions", json=body, timeout=30)
    assert response.status_code == 400, response.text
    assert message in response.json()["error"]["message"]
