"""`kubeinfer router`: an OpenAI-compatible proxy that sends each request to the replica most likely to hold its
prompt's prefix in its KV cache, within a bound on load (docs/router.md)."""
