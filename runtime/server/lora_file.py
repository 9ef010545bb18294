"""Adapters from a file the server watches (`--lora-modules-file PATH`, docs/lora.md): the file holds
`--lora-modules NAME=FOLDER ...` (what the operator's fetcher sidecar writes for the adapters it has fetched), and
the server makes what it serves from the file match it: it loads what is new, loads again what moved to another
folder, and unloads what left. So adapters reach a running replica with no call from outside: the operator needs
no API key to manage them, and reads the outcome from `GET /lora/adapters`.

Adapters loaded over HTTP (`/v1/load_lora_adapter`, e.g. by the router) are not the file's: the watcher never
unloads them. A refusal (a folder of another base model, a rank above the server's) is kept with the engine's
words, shown by `/lora/adapters`, and tried again at most once a minute.
"""
import asyncio
import logging
import os
import shlex
import time
from typing import TYPE_CHECKING

from kubeinfer.runtime.errors import ConfigError, InvalidRequestError
from kubeinfer.runtime.cli_lines import parse_lora_modules
from kubeinfer.runtime.server import lora_api
from kubeinfer.runtime.server.errors import APIError

if TYPE_CHECKING:
    from kubeinfer.runtime.server.admission import ServerState

logger = logging.getLogger(__name__)
POLL_SECONDS = 2.0
RETRY_SECONDS = 60.0   # a refused adapter is tried again after this long (its folder may have been fixed)


def read_modules(text: str) -> dict[str, str]:
    """`--lora-modules A=/x B=/y` (or just `A=/x B=/y`; empty: none) -> {name: folder}."""
    words = [word for word in shlex.split(text) if word != "--lora-modules"]
    return parse_lora_modules(words)


def report(loras: dict[str, str], failed: dict[str, tuple[str, str, float]]) -> list[dict]:
    """Each adapter served (`loras`: name -> folder) or refused (`LoraFile.failed`): {name, path, loaded, message},
    for `GET /lora/adapters`."""
    loaded = [{"name": n, "path": p, "loaded": True, "message": ""} for n, p in loras.items()]
    return loaded + [{"name": n, "path": p, "loaded": False, "message": m}
                     for n, (p, m, _) in failed.items() if n not in loras]


class LoraFile:
    def __init__(self, path: str, started_with: dict[str, str]):
        self.path = path
        self.managed = dict(started_with)   # name -> folder, what this file had the server load
        self.failed: dict[str, tuple[str, str, float]] = {}   # name -> (folder, the engine's refusal, when)
        self._seen: tuple[int, int] | None = None
        self.passes = 0   # changes applied (tests wait for the next one instead of a guessed time)

    def changed(self) -> bool:
        """Whether the file differs (mtime, size) from the last look; a missing file counts as empty."""
        try:
            stat = os.stat(self.path)
            seen = (stat.st_mtime_ns, stat.st_size)
        except FileNotFoundError:
            seen = (0, 0)
        if seen == self._seen:
            return False
        self._seen = seen
        return True

    def desired(self) -> dict[str, str] | None:
        """The file's adapters; None when it cannot be read or parsed (logged; the server keeps what it has)."""
        try:
            with open(self.path) as stream:
                return read_modules(stream.read())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, ConfigError) as error:
            logger.error("--lora-modules-file %s: %s; adapters left as they are", self.path, error)
            return None

    async def apply(self, state: "ServerState", desired: dict[str, str]) -> None:
        """Unload what the file dropped (only what it loaded), then load what is new or moved."""
        for name in [n for n in self.managed if n not in desired]:
            del self.managed[name]
            if name in state.loras:
                await lora_api.unload(state, lora_api.UnloadLoraRequest(lora_name=name))
                logger.info("LoRA adapter %s unloaded: no longer in %s", name, self.path)
        now = time.monotonic()
        self.failed = {name: failure for name, failure in self.failed.items() if desired.get(name) == failure[0]}
        for name, folder in desired.items():
            refused = self.failed.get(name)
            if state.loras.get(name) == folder or (refused is not None and now - refused[2] < RETRY_SECONDS):
                self.managed[name] = folder
                continue
            if name in state.loras:   # moved to another folder: its URI changed
                await lora_api.unload(state, lora_api.UnloadLoraRequest(lora_name=name))
            try:
                await lora_api.load(state, lora_api.LoadLoraRequest(lora_name=name, lora_path=folder))
            except (InvalidRequestError, APIError) as error:
                self.failed[name] = (folder, str(error), now)
                logger.error("LoRA adapter %s from %s not loaded: %s", name, folder, error)
                continue
            self.managed[name] = folder
            self.failed.pop(name, None)
            logger.info("LoRA adapter %s loaded from %s (%s)", name, folder, self.path)

    async def watch(self, state: "ServerState") -> None:
        while True:
            retry = any(time.monotonic() - when >= RETRY_SECONDS for _, _, when in self.failed.values())
            if (self.changed() or retry) and (desired := self.desired()) is not None:
                try:
                    await self.apply(state, desired)
                    self.passes += 1
                except Exception:   # the engine died or a bug: logged, tried again on the next change
                    logger.exception("applying %s failed", self.path)
                    self._seen = None
            await asyncio.sleep(POLL_SECONDS)
