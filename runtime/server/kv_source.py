"""A decode replica's requests whose prompt KV comes from a prefill replica (docs/disaggregation.md).

The router adds `kubeinfer_kv_source: "IP:PORT"` (the prefill replica's KV endpoint) to an ordinary completion or
chat request; the engine then pulls the prompt's KV and first token from there (`EngineCore.add_remote`) and decodes
the rest. Who may name a source: the router only, which drops the field from clients' bodies. It makes this replica
connect to that address and take KV blocks from it into its cache (and prefix cache), so it is refused unless the
replica runs `--kv-role decode`, the address is an IP inside `--kv-source-networks` (private networks and loopback by
default), and the request is one the transfer supports (one prompt and choice, no logprobs, structured output,
LoRA adapter or resume). A decode replica reachable by untrusted clients without the router in between should be
behind a NetworkPolicy (docs/disaggregation.md).

The response waits for the first output (the first token, pulled): a failed transfer (nothing listening, another
model, another protocol version, a timeout, a peer that closed) is then a 502 `kv_transfer_failed` naming the cause,
before any byte of the response, which the router answers by serving the request colocated.
"""
import asyncio
import contextlib
import ipaddress

from fastapi import Request

from kubeinfer.runtime.config import EngineConfig
from kubeinfer.runtime.disagg.errors import TransferError
from kubeinfer.runtime.errors import InvalidRequestError
from kubeinfer.runtime.server.errors import APIError

FIELD = "kubeinfer_kv_source"
TRANSFER_FAILED = "kv_transfer_failed"


def check_kv_source(config: EngineConfig, source: str, params: list, resumed: bool) -> None:
    """Refuses (400 naming the field) a KV source this replica must not pull from, or a request it cannot pull."""
    if config.kv_role != "decode":
        raise InvalidRequestError(f"{FIELD} is taken by a replica started with --kv-role decode only", FIELD)
    host, _, port = source.rpartition(":")
    try:
        address, port = ipaddress.ip_address(host.strip("[]")), int(port)
    except ValueError:
        raise InvalidRequestError(f"{FIELD} is the prefill replica's KV endpoint as IP:PORT, got {source!r}",
                                  FIELD) from None
    if not 1 <= port <= 65535:
        raise InvalidRequestError(f"{FIELD} {source!r}: a port is 1-65535", FIELD)
    if not any(address in ipaddress.ip_network(network) for network in config.kv_source_networks):
        raise InvalidRequestError(f"{FIELD} {source!r} is outside this replica's --kv-source-networks", FIELD)
    if len(params) != 1 or resumed:
        raise InvalidRequestError(f"{FIELD} takes one prompt and one choice (n 1), and no kubeinfer_resume", FIELD)
    first = params[0]
    for name, value in (("logprobs", first.logprobs), ("structured output", first.structured),
                        ("a LoRA adapter", first.lora_name)):
        if value is not None:
            raise InvalidRequestError(f"{name} cannot be combined with {FIELD} (not sent by the prefill replica)",
                                      FIELD)


async def start_pulled(state, job, request: Request) -> bool:
    """Starts the job's one request with its KV pulled from `job.kv_source`, and waits for its first output, which
    `job.outputs` then yields first. False if the client went away meanwhile (the request is aborted); a failed
    transfer raises a 502 APIError."""
    (_, sub_id, prompt, params), = job.sub_requests()
    outputs = state.engine.generate(sub_id, prompt, params, kv_source=job.kv_source)
    first = asyncio.ensure_future(outputs.__anext__())
    left = asyncio.ensure_future(_wait_for_disconnect(request))
    try:
        await asyncio.wait({first, left}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        left.cancel()
    if not first.done():   # the client left: the pull is cancelled, its blocks freed
        first.cancel()
        with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
            await first
        await outputs.aclose()
        return False
    try:
        output = first.result()
    except TransferError as error:
        raise APIError(502, f"the KV transfer from the prefill replica at {job.kv_source} failed: {error}",
                       FIELD, TRANSFER_FAILED) from None
    except InvalidRequestError as error:   # refused by the engine (what a pulled request cannot have)
        raise InvalidRequestError(str(error), FIELD) from None
    job.primed[sub_id] = (output, outputs)
    return True


async def after(first, rest):
    """`first`, then what `rest` yields (closed at the end, which aborts its request if it had not finished)."""
    try:
        yield first
        async for output in rest:
            yield output
    finally:
        await rest.aclose()


async def _wait_for_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
