"""Stored responses (`store: true`, the default) for `previous_response_id` and `GET /v1/responses/{id}`.

Policy: in memory, per replica, bounded. The newest `capacity` responses are kept (least recently used first out);
a restart, or another replica behind the router, does not have them: `previous_response_id` naming a response this
replica does not hold is a 400 that says so, never a silently empty history.
"""
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

DEFAULT_CAPACITY = 1000


@dataclass
class StoredResponse:
    body: dict[str, Any]                  # the response object as returned
    messages: list[dict[str, Any]]        # the conversation: its inputs (history included) and its output


class ResponseStore:
    def __init__(self, capacity: int = DEFAULT_CAPACITY):
        self.capacity = capacity
        self._items: OrderedDict[str, StoredResponse] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    def put(self, response_id: str, stored: StoredResponse) -> None:
        self._items[response_id] = stored
        self._items.move_to_end(response_id)
        while len(self._items) > self.capacity:
            self._items.popitem(last=False)

    def get(self, response_id: str) -> StoredResponse | None:
        stored = self._items.get(response_id)
        if stored is not None:
            self._items.move_to_end(response_id)
        return stored

    def delete(self, response_id: str) -> bool:
        return self._items.pop(response_id, None) is not None
