"""The API end of the engine's process pipe, watched by the event loop that serves: a message that reaches the
pipe in pieces (a large step message on a busy machine) is read whole, on asyncio's loop and on uvloop."""
import asyncio
import multiprocessing
import os
import pickle
import struct
import threading
import time

import pytest

from kubeinfer.runtime.engine.channels import PipeEnd
from kubeinfer.runtime.engine.messages import EngineStats, StepOutput, TokenDelta, TokenLogprobs

uvloop = pytest.importorskip("uvloop", reason="uvloop is not installed (it has no Windows build)")
LOOPS = {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}


def write_in_two_pieces(fd: int, message: StepOutput, pause: float) -> None:
    """multiprocessing's framing (a 4-byte length, then the pickle), split mid-message."""
    data = pickle.dumps(message)
    framed = struct.pack("!i", len(data)) + data
    os.write(fd, framed[:len(framed) // 2])
    time.sleep(pause)
    os.write(fd, framed[len(framed) // 2:])


@pytest.mark.parametrize("loop_name", sorted(LOOPS))
def test_a_message_written_in_pieces_arrives_whole(loop_name):
    api_conn, core_conn = multiprocessing.Pipe(duplex=True)
    api = PipeEnd(api_conn)
    deltas = [TokenDelta(f"request-{i}", i, TokenLogprobs(i, -0.5, [(i, -0.5), (7, -1.5)]), None, None, 0, 1.0)
              for i in range(400)]
    message = StepOutput(deltas, EngineStats(400, 0, 0.5, 0, 0, 0), 0.01, {"": 400})
    loop = LOOPS[loop_name]()
    try:
        async def receive_one() -> list[StepOutput]:
            arrived: asyncio.Future = loop.create_future()

            def readable() -> None:
                try:
                    received = api.receive()
                except BaseException as error:   # noqa: BLE001 - the test reports it
                    arrived.set_exception(error)
                else:
                    if received and not arrived.done():
                        arrived.set_result(received)
            api.watch(loop, readable)
            writer = threading.Thread(target=write_in_two_pieces, args=(core_conn.fileno(), message, 0.2))
            writer.start()
            try:
                return await asyncio.wait_for(arrived, 10)
            finally:
                loop.remove_reader(api.fileno())
                writer.join()
        assert loop.run_until_complete(receive_one()) == [message]
    finally:
        loop.close()
        api_conn.close()
        core_conn.close()
