"""The messages between the API process and the engine core (runtime/engine/messages.py): each survives the pipe
unchanged, and either side refuses a message it does not know (an old tuple, say) in words rather than misreading it."""
import dataclasses
import pickle
import typing

import pytest

from kubeinfer.runtime.engine import messages
from kubeinfer.runtime.engine.messages import (AbortRequests, AddRemoteRequest, AddRequest, EngineFailed, EngineInfo,
                                               EngineStats, FromEngine, LoraDone, LoraOperation, PutToSleep, Ready,
                                               RequestFailed, Rejected, Shutdown, Slept, StepOutput, StepsRead,
                                               StopRequest, ToEngine, TokenDelta, TokenLogprobs, TransferFailed,
                                               WakeUp, Woke)
from kubeinfer.runtime.sampling_params import SamplingParams

PARAMS = SamplingParams(max_tokens=5, temperature=0.7, seed=3, stop=["\n"], logit_bias={4: -1.0}, tenant="a")
STATS = EngineStats(2, 1, 0.25, 0, 3, 8, lora_running={"ad": 1}, kv_transfer={"completed": 1})
DELTA = TokenDelta("r1", 9, TokenLogprobs(9, -0.1, [(9, -0.1), (4, -2.3)]), "stop", 9, 4, 12.5, 12.0)
INFO = EngineInfo(512, 64, 16, 1000, (2,), {"weights": 0.5}, 3, {"ad": "/adapters/ad"}, 1, "prefill", "10.0.0.1:7000")
EXAMPLES = [
    AddRequest("r1", [1, 2, 3], PARAMS, 100.5, [4, 5]),
    AddRemoteRequest("r2", [1, 2], PARAMS, 101.0, "10.0.0.1:7000"),
    AbortRequests(["r1", "r2"]),
    StopRequest("r1", "\n"),
    StepsRead(2),
    LoraOperation(1, "load", "ad", "/adapters/ad"),
    PutToSleep(2, 1),
    WakeUp(3),
    Shutdown(),
    Ready(INFO),
    StepOutput([DELTA], STATS, 0.004, {"a": 3, "": 1}),
    StepOutput([], STATS, None, {}),
    Rejected("r1", "the prompt is empty"),
    LoraDone(1, None),
    Slept(2, None, {"level": 1, "seconds": 0.2, "bytes": 4096}),
    Woke(None, {"level": 1, "seconds": 0.1}),
    TransferFailed("r2", "the KV source closed the connection"),
    RequestFailed("r1", "adapter ad cannot be read"),
    EngineFailed("OutOfMemoryError: CUDA out of memory"),
]


def test_every_message_type_has_an_example_here():
    kinds = set(typing.get_args(ToEngine)) | set(typing.get_args(FromEngine))
    assert {type(example) for example in EXAMPLES} == kinds
    defined = {value for value in vars(messages).values() if isinstance(value, type) and dataclasses.is_dataclass(value)
               and value.__module__ == messages.__name__ and value.__dataclass_params__.frozen}
    assert defined == kinds   # no message type left out of the two unions


@pytest.mark.parametrize("message", EXAMPLES, ids=lambda message: type(message).__name__)
def test_a_message_is_itself_after_the_pipe(message):
    """What the process pipe does to each message: pickle, unpickle."""
    assert pickle.loads(pickle.dumps(message)) == message
    assert not hasattr(message, "__dict__")   # slotted: the step message is sent every step
    for field in dataclasses.fields(message):   # frozen: what was sent is what the other side reads
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(message, field.name, None)


class Channel:
    def __init__(self, *inbox):
        self.inbox, self.sent = list(inbox), []

    def receive(self, timeout=0.0):
        return self.inbox.pop(0) if self.inbox else []

    def send(self, message):
        self.sent.append(message)


class IdleCore:
    idle_wait_s, kv_importer, request_wakes = None, None, []

    def has_unfinished(self):
        return False

    def stats(self, fresh=False):
        return STATS


def test_the_engine_loop_refuses_a_message_it_does_not_know():
    """An old-style tuple reaches the loop: it raises, naming the message (run_core then sends EngineFailed and the
    engine ends), rather than reading it as something else."""
    from kubeinfer.runtime.engine.core_loop import serve_core
    channel = Channel([("add", "r1", [1, 2], PARAMS, 0.0, [])])
    with pytest.raises(TypeError, match=r"the engine got a message it does not know: \('add', 'r1'"):
        serve_core(IdleCore(), channel)
    assert channel.sent == []


def test_the_engine_loop_answers_a_wake_up_and_stops_on_shutdown():
    from kubeinfer.runtime.engine.core_loop import serve_core

    class Core(IdleCore):
        def wake_up(self):
            return {"level": 0, "seconds": 0.0}
    channel = Channel([PutToSleep(1, 2), WakeUp(2)], [Shutdown()])
    serve_core(Core(), channel)
    assert channel.sent == [Slept(1, "cancelled: a wake_up came before the engine was idle", None),
                            Woke(2, {"level": 0, "seconds": 0.0}), StepOutput([], STATS, None, {})]


def test_the_api_side_ends_the_engine_on_a_message_it_does_not_know(llama_dir):
    """The engine's side of the contract broken: the client marks the engine dead, saying what came."""
    from kubeinfer.runtime.config import EngineConfig
    from kubeinfer.runtime.server.engine_client import EngineClient
    from kubeinfer.runtime.server.metrics import EngineMetrics
    from kubeinfer.runtime.tokenizer import Tokenizer
    client = EngineClient(EngineConfig(str(llama_dir)), Tokenizer(str(llama_dir)), EngineMetrics("m"), mode="thread")
    client._channel = Channel([Woke(None, {"level": 0, "seconds": 0.0}), ("step", [], STATS, 0.01, {})])
    client._on_readable()
    assert client.error is not None and "the engine sent a message this side does not know: ('step'" in str(client.error)
