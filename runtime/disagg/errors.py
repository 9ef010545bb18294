"""What can go wrong with a KV transfer, each with a message that says which side and why."""
from kubeinfer.runtime.errors import KubeinferError


class TransferError(KubeinferError):
    """A KV transfer failed; the request's blocks are freed on both sides."""


class ProtocolVersionError(TransferError):
    """The peer speaks another version of the KV protocol (or is not a KV endpoint at all)."""


class LayoutMismatchError(TransferError):
    """The two replicas' KV caches differ (another model, dtype, block size, ...)."""


class ChecksumError(TransferError):
    """A frame arrived corrupted."""


class TransferTimeoutError(TransferError):
    """The peer sent nothing (not even a keepalive) for the idle timeout, or did not take our bytes."""


class PeerClosedError(TransferError):
    """The peer closed the connection before the transfer ended."""
