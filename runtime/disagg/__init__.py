"""Disaggregated prefill and decode: a prefill replica computes a prompt's KV and first token, a decode replica
pulls those KV blocks into its own paged cache and goes on decoding (docs/disaggregation.md).

- `layout`: what both sides' KV caches must agree on, checked at the start of every transfer.
- `wire`: the binary protocol's frames (preamble with the protocol version, per-frame checksums); `errors`.
- `connector`: the transport interface (a TCP one here; room for NIXL/UCX or NCCL).
- `tcp_source` / `tcp_puller`: the TCP transport's prefill (serving) and decode (pulling) ends; `block_io`: a
  block's bytes in a cache, as the transport reads and writes them.
- `exporter` / `importer`: the engine's side of each role, run at the engine's step boundaries; `roles` gives an
  engine core its role from the config.
"""
