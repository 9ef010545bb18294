"""kubeinfer: a Kubernetes operator for managed LLM inference, with its own runtime.

Subpackages: `kubeinfer.runtime` (engine and server), `kubeinfer.kernels` (Triton kernels and references),
`kubeinfer.operator` (the InferenceService operator).
"""
__version__ = "0.1.0"
