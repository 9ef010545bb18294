"""Structured output: requests' JSON schemas turned into grammars (API process), grammars enforced on the sampled
tokens by a token bitmask per step (engine process). The grammar library is llguidance (docs/server.md says why)."""
