"""Stored responses (`store: true`, the default) for `previous_response_id` and `GET`/`DELETE /v1/responses/{id}`.

Policy: in memory, per replica, bounded in count and age. The newest `capacity` responses are kept (least recently
used first out), each for `ttl_s` after it was stored (OpenAI keeps them 30 days; a replica's memory is no archive:
an hour by default). A restart, or another replica behind the router, does not have them; the router sends a
continuation to the replica that answered (runtime/router/response_owners.py). Each response belongs to the tenant
that made it (its API key's, or a trusted gateway's): another tenant's id reads as unknown, so no tenant learns
that another's response exists. An unknown, expired or foreign id is a 404 with the OpenAI error body.
"""
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

DEFAULT_CAPACITY = 1000
DEFAULT_TTL_S = 3600.0


@dataclass
class StoredResponse:
    body: dict[str, Any]                  # the response object as returned
    messages: list[dict[str, Any]]        # the conversation: its inputs (history included) and its output
    owner: str = ""                       # the tenant that made it (auth.Tenant.name)
    stored_at: float = field(default_factory=time.monotonic)


class ResponseStore:
    def __init__(self, capacity: int = DEFAULT_CAPACITY, ttl_s: float = DEFAULT_TTL_S, clock=time.monotonic):
        self.capacity, self.ttl_s, self._clock = capacity, ttl_s, clock
        self._items: OrderedDict[str, StoredResponse] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    def put(self, response_id: str, stored: StoredResponse) -> None:
        stored.stored_at = self._clock()
        self._items[response_id] = stored
        self._items.move_to_end(response_id)
        while len(self._items) > self.capacity:
            self._items.popitem(last=False)

    def get(self, response_id: str, owner: str) -> StoredResponse | None:
        """The response, if stored, not expired, and `owner`'s."""
        stored = self._items.get(response_id)
        if stored is not None and self._clock() - stored.stored_at > self.ttl_s:
            del self._items[response_id]
            return None
        if stored is None or stored.owner != owner:
            return None
        self._items.move_to_end(response_id)
        return stored

    def delete(self, response_id: str, owner: str) -> bool:
        if self.get(response_id, owner) is None:
            return False
        del self._items[response_id]
        return True
