"""What the router changes in what it relays: the headers that stop at each hop, the replica's name added to each
answer, and the error event that ends a stream the router could not finish."""
import json

from kubeinfer.runtime.router.upstream import Response

HOP_BY_HOP = {b"connection", b"keep-alive", b"transfer-encoding", b"te", b"upgrade", b"proxy-authorization",
              b"proxy-authenticate", b"trailer", b"host", b"content-length",
              b"expect"}   # uvicorn answered the client's `Expect: 100-continue`; the replica gets the whole body
REPLICA_HEADER = "x-kubeinfer-replica"


def authorization(headers: list[tuple[bytes, bytes]]) -> bytes | None:
    """A request's `Authorization` value (the router holds no key: its own calls to a replica carry the request's)."""
    return next((value for name, value in headers if name.lower() == b"authorization"), None)


def request_headers(scope: dict) -> list[tuple[bytes, bytes]]:
    return [(k, v) for k, v in scope["headers"] if k.lower() not in HOP_BY_HOP]


def response_headers(response: Response, replica_url: str) -> list[tuple[bytes, bytes]]:
    headers = [(k, v) for k, v in response.headers if k not in HOP_BY_HOP - {b"content-length"}]
    return headers + [(REPLICA_HEADER.encode(), replica_url.encode())]


def sse_error(message: str) -> bytes:
    body = {"error": {"message": message, "type": "server_error", "param": None, "code": "replica_failed"}}
    return b"data: " + json.dumps(body).encode() + b"\n\n"
