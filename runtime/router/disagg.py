"""Disaggregated serving at the router (docs/disaggregation.md): a prefill pool besides the replicas (the decode pool).

For a request the transfer supports (`eligible`), the router picks a prefill replica by prefix affinity (its own
prefix index over the prefill pool: the prefill replica's prefix cache is what saves recomputation) and a decode
replica by load and KV headroom (`pick_decode`), and sends the request to the decode replica with
`kubeinfer_kv_source` naming the prefill replica's KV endpoint (learnt from its `kubeinfer_kv_role` series). The
decode replica pulls the KV and streams the answer, which the router relays as any other.

- No prefill replica up, no decode pool replica with `--kv-role decode`, or a request the transfer does not support: served colocated on the decode pool, as without
  a prefill pool (`path="colocated"`).
- The transfer fails (the decode replica answers 502 `kv_transfer_failed`, or refuses the field with a 400 naming it,
  before any byte of its answer): the prefill replica is out of the pick for `FAILED_HOLD_SECONDS` and until it
  scrapes again, and the request is sent again as an ordinary one, colocated (`path="fallback"`). The client sees one
  answer.
- The decode replica fails: the proxy's own retry and resume apply; those attempts are colocated.

A client never names the KV source: the router drops `kubeinfer_kv_source` from every body it is sent (`strip_source`).
"""
import json
import logging
import time

from kubeinfer.runtime.disagg.source_signature import FIELD as SIGNATURE_FIELD, read_key, sign
from kubeinfer.runtime.router.affinity import Weights
from kubeinfer.runtime.router.metrics import RouterMetrics
from kubeinfer.runtime.router.policies import Chooser
from kubeinfer.runtime.router.replicas import Replica, ReplicaSet
from kubeinfer.runtime.router.resume import RESUMABLE_PATHS, one_prompt
from kubeinfer.runtime.router.route_trace import UNTRACED
from kubeinfer.runtime.router.settings import RouterSettings

logger = logging.getLogger(__name__)
SOURCE_FIELD = "kubeinfer_kv_source"
TRANSFER_FAILED = b'"kv_transfer_failed"'
FAILED_HOLD_SECONDS = 5.0
PATHS = ("disaggregated", "fallback", "colocated")


def strip_source(body: bytes, parsed):
    """(body, parsed) without a client's `kubeinfer_kv_source` (or signature): only the router may name one."""
    if isinstance(parsed, dict) and (SOURCE_FIELD in parsed or SIGNATURE_FIELD in parsed):
        parsed = {k: v for k, v in parsed.items() if k not in (SOURCE_FIELD, SIGNATURE_FIELD)}
        return json.dumps(parsed).encode(), parsed
    return body, parsed


def eligible(path: str, parsed, adapter: str | None) -> bool:
    """A completion or chat of one prompt and one choice, for the base model, without what the prefill replica does
    not send (the first token's logprobs, a grammar's state) and not a continuation (`kubeinfer_resume`)."""
    if path not in RESUMABLE_PATHS or not isinstance(parsed, dict) or adapter is not None:
        return False
    if parsed.get("n") not in (1, None) or not one_prompt(parsed.get("prompt")) or "kubeinfer_resume" in parsed:
        return False
    if parsed.get("logprobs") not in (None, False) or parsed.get("top_logprobs") is not None:
        return False
    response_format = parsed.get("response_format")
    if isinstance(response_format, dict) and response_format.get("type", "text") != "text":
        return False
    tool_choice = parsed.get("tool_choice")
    return not (parsed.get("tools") and (tool_choice == "required" or isinstance(tool_choice, dict)))


def pick_decode(available: list[Replica], weights: Weights, stale_after: float) -> tuple[Replica, str]:
    """The decode replica with the least load (requests in flight here and waiting there, as a share of the busiest)
    and KV use, weighted as the prefix policy weighs them; stale data reads as busy."""
    now = time.monotonic()
    busiest = max(r.in_flight + r.waiting for r in available) or 1.0

    def cost(replica: Replica):
        load = (replica.in_flight + replica.waiting) / busiest
        return replica.is_stale(now, stale_after), weights.load * load + weights.kv * replica.kv_usage, replica.url
    return min(available, key=cost), "decode"


def decoders(available: list[Replica]) -> list[Replica]:
    """The replicas that pull KV (`--kv-role decode`): a decode pool's others serve colocated only."""
    return [r for r in available if r.kv_role == "decode"]


def is_transfer_failure(status: int, body: bytes) -> bool:
    """The decode replica's answer says the KV transfer failed, or that it would not pull for this request."""
    if status == 502 and TRANSFER_FAILED in body:
        return True
    if status != 400:
        return False
    try:
        return json.loads(body)["error"]["param"] in (SOURCE_FIELD, SIGNATURE_FIELD)
    except (ValueError, KeyError, TypeError):
        return False


class PrefillPool:
    def __init__(self, settings: RouterSettings, metrics: RouterMetrics):
        self.settings, self.metrics = settings, metrics
        self.replicas = ReplicaSet(settings.prefill_upstreams, settings.scrape_interval, settings.stale_after,
                                   settings.connect_timeout)
        self.chooser = Chooser(settings)   # its own prefix index: what each prefill replica was sent
        self.source_key = read_key(settings.kv_source_key_file)   # signs the hint (disagg/source_signature.py)

    def available(self) -> list[Replica]:
        return [r for r in self.replicas.available() if r.kv_port is not None]

    def pick(self, text: str) -> Replica | None:
        available = self.available()
        return self.chooser.choose(available, text)[0] if available else None

    async def open(self, proxy, path: str, headers: list, parsed, text: str, adapter: str | None,
                   received_at: float | None, tenant, trace=UNTRACED):
        """(decode replica, response, prefetched body) of the request sent disaggregated, or None: serve it
        colocated (counted here as colocated or fallback)."""
        prefill = None
        if eligible(path, parsed, adapter) and decoders(proxy.replicas.available()):
            prefill = self.pick(text)
        if prefill is None:
            self.metrics.disaggregated.labels("colocated").inc()
            return None
        hint = {SOURCE_FIELD: prefill.kv_endpoint}
        if self.source_key is not None:
            hint[SIGNATURE_FIELD] = sign(self.source_key, prefill.kv_endpoint)
        body = json.dumps(dict(parsed, **hint)).encode()
        prefill.in_flight += 1   # until the decode replica answers: it answers once the first token is pulled
        try:
            replica, response, prefetched = await proxy._open(path, headers, body, parsed, text, adapter,
                                                              received_at, tenant, decode=True, trace=trace)
        finally:
            prefill.in_flight -= 1
        if response.status in (400, 502):
            if prefetched is None:
                try:
                    prefetched = await response.read()
                except BaseException:
                    replica.in_flight -= 1
                    response.close()
                    raise
            if is_transfer_failure(response.status, prefetched):
                replica.in_flight -= 1
                response.release()
                why = prefetched.decode(errors="replace")[:300]
                logger.warning("KV transfer from %s to %s failed, serving colocated: %s", prefill.url, replica.url, why)
                self.replicas.mark_down(prefill, "a KV transfer from it failed", FAILED_HOLD_SECONDS)
                self.chooser.forget(prefill)
                self.metrics.disaggregated.labels("fallback").inc()
                trace.attempt_ended(f"KV transfer failed, serving colocated: {why}", response.status)
                return None
        self.metrics.disaggregated.labels("disaggregated").inc()
        return replica, response, prefetched
