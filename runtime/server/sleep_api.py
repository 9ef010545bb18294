"""Sleep and wake over HTTP with vLLM's routes (docs/runtime.md, "Sleep"): `POST /sleep?level=1|2` answers once the
engine sleeps (after its requests in flight have finished), `POST /wake_up` once it is awake, `GET /is_sleeping`.
A request that arrives while the engine sleeps wakes it and waits for that; none is refused or lost.
"""
from typing import TYPE_CHECKING

from kubeinfer.runtime.engine.messages import SLEEP_LEVELS
from kubeinfer.runtime.server.errors import APIError

if TYPE_CHECKING:
    from kubeinfer.runtime.server.admission import ServerState


def parse_level(text: str | None) -> int:
    if text is None:
        return 1
    if text.strip() not in tuple(map(str, SLEEP_LEVELS)):
        raise APIError(400, f"level must be 1 (weights kept in host memory) or 2 (weights dropped), got {text!r}",
                       "level")
    return int(text)


async def sleep(state: "ServerState", level_text: str | None) -> dict:
    figures = await state.engine.sleep(parse_level(level_text))
    return {"is_sleeping": True, **figures}


async def wake_up(state: "ServerState") -> dict:
    figures = await state.engine.wake_up()
    return {"is_sleeping": False, "woke_from_level": figures["level"], "seconds": figures["seconds"]}


def is_sleeping(state: "ServerState") -> dict:
    return {"is_sleeping": state.engine.sleep_level > 0, "level": state.engine.sleep_level}
