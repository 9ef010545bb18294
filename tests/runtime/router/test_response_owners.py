"""The router's memory of which replica answered each Responses API response (router/response_owners.py)."""
from kubeinfer.runtime.router.response_owners import ResponseOwners

ID_A, ID_B, ID_C = (f"resp_{c * 32}" for c in "abc")


def test_ids_are_read_from_a_json_body_or_a_streams_first_event():
    owners = ResponseOwners()
    owners.learn(b'{"id": "' + ID_A.encode() + b'", "object": "response", "output": []}', "http://r1")
    owners.learn(b'event: response.created\ndata: {"type":"response.created","sequence_number":0,"response":{"id":"'
                 + ID_B.encode() + b'","object":"response"}}\n\n', "http://r2")
    owners.learn(b'{"id": "msg_' + b"d" * 32 + b'"}', "http://r3")   # not a response id
    assert (owners.owner(ID_A), owners.owner(ID_B), owners.owner("msg_" + "d" * 32)) == ("http://r1", "http://r2", None)
    assert owners.owner(None) is None and owners.owner(42) is None


def test_the_oldest_ids_go_first_beyond_the_bound():
    owners = ResponseOwners(max_ids=2)
    for response_id, url in ((ID_A, "http://r1"), (ID_B, "http://r2"), (ID_C, "http://r1")):
        owners.learn(f'{{"id": "{response_id}"}}'.encode(), url)
    assert len(owners) == 2 and owners.owner(ID_A) is None and owners.owner(ID_C) == "http://r1"
