"""LoRA adapters over HTTP (docs/lora.md): `/v1/load_lora_adapter` and `/v1/unload_lora_adapter` with vLLM's names
and bodies, which `model` names an adapter, and the adapters `/v1/models` lists with their parent.

The API process keeps the names it serves (`ServerState.loras`); the engine checks an adapter against the model
before it is served, and its answer (the reason, for a bad adapter) is the HTTP answer.
"""
import re
from typing import TYPE_CHECKING

from pydantic import BaseModel

from kubeinfer.runtime.server.errors import APIError

if TYPE_CHECKING:
    from kubeinfer.runtime.server.admission import ServerState

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}")


class LoadLoraRequest(BaseModel):
    lora_name: str
    lora_path: str


class UnloadLoraRequest(BaseModel):
    lora_name: str


def adapter_of(state: "ServerState", model: str) -> str | None:
    """The adapter a request's `model` names; None for the base model; 404 for a name not served here."""
    if model == state.config.served_model_name:
        return None
    if model in state.loras:
        return model
    served = [state.config.served_model_name, *state.loras]
    raise APIError(404, f"model {model!r} is not served here; this server serves {', '.join(map(repr, served))}",
                   "model", "model_not_found")


async def load(state: "ServerState", body: LoadLoraRequest) -> str:
    name = body.lora_name
    if not NAME.fullmatch(name):
        raise APIError(400, f"lora_name {name!r} must be 1-128 letters, digits and ._:/- (a model name)", "lora_name")
    if name == state.config.served_model_name:
        raise APIError(400, f"lora_name {name!r} is the base model's name", "lora_name")
    await state.engine.lora("load", name, body.lora_path)   # InvalidRequestError (400) with what is wrong
    state.loras[name] = body.lora_path
    state.metrics.set_adapters(state.loras)
    return f"Success: LoRA adapter '{name}' added successfully."


async def unload(state: "ServerState", body: UnloadLoraRequest) -> str:
    name = body.lora_name
    if name not in state.loras:
        raise APIError(404, f"LoRA adapter {name!r} is not loaded", "lora_name", "model_not_found")
    del state.loras[name]   # new requests get 404 now; running ones finish on it
    state.metrics.set_adapters(state.loras)
    await state.engine.lora("unload", name, None)
    return f"Success: LoRA adapter '{name}' removed successfully."


def model_cards(state: "ServerState", created: int) -> list[dict]:
    return [{"id": name, "object": "model", "created": created, "owned_by": "kubeinfer", "root": path,
             "parent": state.config.served_model_name} for name, path in state.loras.items()]
