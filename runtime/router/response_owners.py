"""Which replica stored each Responses API response, so that a continuation (`previous_response_id`) goes back to
it: a replica's store is its own (docs/server.md), and any other replica answers such a request with a 400.

The router learns the id from the start of each `/v1/responses` answer it relays: the JSON body, or the first
event of a stream (`response.created`), both carry `"id": "resp_<32 hex>"` before any output text. Bounded:
the oldest ids go first, beyond what a replica's own store keeps of them.
"""
import re
from collections import OrderedDict

RESPONSE_ID = re.compile(rb'"id":\s*"(resp_[0-9a-f]{32})"')
SNIFF_BYTES = 4096   # the id comes in the first object or event; no need to scan a long answer
MAX_IDS = 100_000


class ResponseOwners:
    def __init__(self, max_ids: int = MAX_IDS):
        self.max_ids = max_ids
        self._owner: OrderedDict[str, str] = OrderedDict()

    def __len__(self) -> int:
        return len(self._owner)

    def learn(self, first_bytes: bytes, replica_url: str) -> None:
        """Records the replica of the response whose answer starts with `first_bytes` (nothing if no id is there)."""
        found = RESPONSE_ID.search(first_bytes[:SNIFF_BYTES])
        if found is None:
            return
        self._owner[found.group(1).decode()] = replica_url
        self._owner.move_to_end(found.group(1).decode())
        while len(self._owner) > self.max_ids:
            self._owner.popitem(last=False)

    def owner(self, response_id: object) -> str | None:
        """The replica that answered `response_id`, if the router relayed it and still remembers."""
        return self._owner.get(response_id) if isinstance(response_id, str) else None
