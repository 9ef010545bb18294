"""The router's signature on a KV-source hint (`--kv-source-key-file`, docs/disaggregation.md): with a key shared by
the router and the decode replicas, a decode replica pulls KV only from a source the router named, not from one any
client in the allowed networks names by talking to the replica directly.

`kubeinfer_kv_source_signature` = `EXPIRES.MAC`: EXPIRES a Unix time at most SIGNATURE_TTL_S ahead, MAC the hex
HMAC-SHA256 under the key of `SOURCE\\nEXPIRES`. It binds the source and a short lifetime, not the body: a hint
replayed with another body within its lifetime can only make the replica pull from that same prefill replica, which
then has no such prompt (the transfer fails and the router serves the request colocated).
"""
import hashlib
import hmac
import time
from pathlib import Path

from kubeinfer.runtime.errors import ConfigError, InvalidRequestError

FIELD = "kubeinfer_kv_source_signature"
SIGNATURE_TTL_S = 60
MIN_KEY_BYTES = 16


def read_key(path: str | None) -> bytes | None:
    """The key in the file (its bytes, surrounding whitespace dropped); None without a file."""
    if not path:
        return None
    try:
        key = Path(path).read_bytes().strip()
    except OSError as error:
        raise ConfigError(f"--kv-source-key-file {path!r} cannot be read: {error.strerror or error}") from None
    if len(key) < MIN_KEY_BYTES:
        raise ConfigError(f"--kv-source-key-file {path!r}: the key must be at least {MIN_KEY_BYTES} bytes")
    return key


def _mac(key: bytes, source: str, expires: int) -> str:
    return hmac.new(key, f"{source}\n{expires}".encode(), hashlib.sha256).hexdigest()


def sign(key: bytes, source: str, now: float | None = None) -> str:
    expires = int(time.time() if now is None else now) + SIGNATURE_TTL_S
    return f"{expires}.{_mac(key, source, expires)}"


def verify(key: bytes, source: str, signature: object, now: float | None = None) -> None:
    """Refuses (400 naming the field) a hint the router did not sign with this key, or whose lifetime is over."""
    if not isinstance(signature, str) or "." not in signature:
        raise InvalidRequestError(f"kubeinfer_kv_source needs the router's {FIELD} on this replica "
                                  "(--kv-source-key-file)", FIELD)
    expires_text, _, mac = signature.partition(".")
    now = time.time() if now is None else now
    try:
        expires = int(expires_text)
    except ValueError:
        expires = -1
    if not hmac.compare_digest(mac.encode(), _mac(key, source, expires).encode()):
        raise InvalidRequestError(f"{FIELD} does not match kubeinfer_kv_source under this replica's key", FIELD)
    if not now <= expires <= now + 2 * SIGNATURE_TTL_S:
        raise InvalidRequestError(f"{FIELD} has expired (or is dated too far ahead: the clocks disagree)", FIELD)
