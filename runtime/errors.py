"""Typed errors of the runtime. The server maps `InvalidRequestError` to HTTP 400."""


class KubeinferError(Exception):
    """Base of every error the runtime raises on purpose."""


class InvalidRequestError(KubeinferError, ValueError):
    """A request (prompt or sampling parameters) that cannot be served as asked."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


class ConfigError(KubeinferError, ValueError):
    """An engine setting that is out of range or inconsistent with the model."""


class ModelLoadError(KubeinferError):
    """A model folder that cannot be loaded: missing files, missing or mis-shaped weights."""


class UnsupportedModelError(ModelLoadError):
    """A model whose architecture or settings the runtime does not implement."""
