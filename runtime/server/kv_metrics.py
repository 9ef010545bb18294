"""Disaggregated serving's series (docs/server.md): the replica's KV role, and its transfers' counters.

The engine keeps the counters (runtime/disagg's importer and exporter) and sends them with each step's stats; they
are cumulative there, and added here as they grow. A replica without a role exports only `kubeinfer_kv_role`.
"""
from prometheus_client import CollectorRegistry, Counter, Gauge

OUTCOMES = ("completed", "failed")
BLOCK_KINDS = {"decode": ("pulled", "reused"), "prefill": ("sent",)}


class KVTransferMetrics:
    def __init__(self, registry: CollectorRegistry, model_name: str):
        labels = ["model_name"]
        self.model_name = model_name
        self.role = Gauge("kubeinfer_kv_role", "This replica's role in disaggregated serving, 1 on its series: "
                          "prefill (kv_port: its KV endpoint's port), decode, or none", labels + ["role", "kv_port"],
                          registry=registry)
        self.transfers = Counter("kubeinfer_kv_transfer_requests", "KV transfers ended, by outcome: completed "
                                 "(decode: pulled, decoding here; prefill: the first token sent), failed",
                                 labels + ["role", "outcome"], registry=registry)
        self.blocks = Counter("kubeinfer_kv_transfer_blocks", "KV blocks of transfers: pulled (decode: received), "
                              "reused (decode: held by its own prefix cache, not asked for), sent (prefill)",
                              labels + ["kind"], registry=registry)
        self.in_flight = Gauge("kubeinfer_kv_transfer_in_flight", "KV transfers queued or under way", labels,
                               registry=registry)
        self._role: str | None = None
        self._seen: dict[str, int] = {}

    def set_role(self, role: str | None, address: str | None) -> None:
        """Once the engine is up: its role, and the port its KV endpoint listens on (prefill); every series at 0."""
        port = address.rpartition(":")[2] if address else ""
        self.role.labels(self.model_name, role or "none", port).set(1)
        self._role = role
        if role is None:
            return
        for outcome in OUTCOMES:
            self.transfers.labels(self.model_name, role, outcome)
        for kind in BLOCK_KINDS[role]:
            self.blocks.labels(self.model_name, kind)
        self.in_flight.labels(self.model_name).set(0)

    def observe(self, counts: dict[str, int] | None) -> None:
        """The engine's counters after a step (`kv_transfer_counts`)."""
        if not counts or self._role is None:
            return
        for name, value in counts.items():
            if name == "in_flight":
                self.in_flight.labels(self.model_name).set(value)
                continue
            grown = value - self._seen.get(name, 0)
            if grown > 0:
                if name in OUTCOMES:
                    self.transfers.labels(self.model_name, self._role, name).inc(grown)
                else:
                    self.blocks.labels(self.model_name, name.removeprefix("blocks_")).inc(grown)
            self._seen[name] = value
