"""The two ends of the link between the API side and the engine core, over a pipe or inside one process.

Messages are the dataclasses of `engine/messages.py` (ToEngine one way, FromEngine the other). Each end has the same
two calls: `send(message)` and `receive(timeout)` -> every message waiting (after waiting up to `timeout` seconds for
the first; None waits for ever). The API end also has `watch(loop, callback)`: the event loop calls back when a
message waits (`fileno()` is the descriptor it watches). A closed peer raises EOFError.

- Process mode: a `multiprocessing` duplex pipe; messages are pickled (one message per engine step).
- Thread mode: two queues, and an OS pipe that wakes the event loop.
"""
import os
import queue
from multiprocessing.connection import Connection

from kubeinfer.runtime.engine.messages import FromEngine, ToEngine


class PipeEnd:
    """Either end of a process pipe."""

    def __init__(self, conn: Connection):
        self.conn = conn

    def fileno(self) -> int:
        return self.conn.fileno()

    def watch(self, loop, callback) -> None:
        loop.add_reader(self.fileno(), callback)
        # uvloop (libuv) makes a watched descriptor non-blocking; recv() of a message that is still being
        # written would then raise BlockingIOError half-way through it, and the message would be lost.
        os.set_blocking(self.fileno(), True)

    def send(self, message: ToEngine | FromEngine) -> None:
        self.conn.send(message)

    def receive(self, timeout: float | None = 0.0) -> list[ToEngine | FromEngine]:
        messages = []
        while self.conn.poll(timeout):
            messages.append(self.conn.recv())
            timeout = 0.0
        return messages


class _QueueEnd:
    def __init__(self, inbox: queue.SimpleQueue, outbox: queue.SimpleQueue, wake_fd: int | None):
        self.inbox, self.outbox, self.wake_fd = inbox, outbox, wake_fd

    def send(self, message: ToEngine | FromEngine) -> None:
        self.outbox.put(message)
        if self.wake_fd is not None:
            try:
                os.write(self.wake_fd, b"\0")
            except BlockingIOError:   # the pipe is full: a wake-up is pending anyway
                pass

    def receive(self, timeout: float | None = 0.0) -> list[ToEngine | FromEngine]:
        messages = []
        try:
            messages.append(self.inbox.get(timeout=timeout) if timeout != 0.0 else self.inbox.get_nowait())
            while True:
                messages.append(self.inbox.get_nowait())
        except queue.Empty:
            pass
        return messages


class ThreadLink:
    """Both ends for a core that runs on a thread of the API process."""

    def __init__(self):
        to_core, to_api = queue.SimpleQueue(), queue.SimpleQueue()
        self._wake_read, wake_write = os.pipe()
        os.set_blocking(self._wake_read, False)
        os.set_blocking(wake_write, False)
        self.api = _ApiQueueEnd(to_api, to_core, None, self._wake_read)
        self.core = _QueueEnd(to_core, to_api, wake_write)


class _ApiQueueEnd(_QueueEnd):
    def __init__(self, inbox, outbox, wake_fd, wake_read: int):
        super().__init__(inbox, outbox, wake_fd)
        self.wake_read = wake_read

    def fileno(self) -> int:
        return self.wake_read

    def watch(self, loop, callback) -> None:
        loop.add_reader(self.wake_read, callback)   # the wake-up pipe is non-blocking anyway

    def receive(self, timeout: float | None = 0.0) -> list[ToEngine | FromEngine]:
        try:
            while os.read(self.wake_read, 4096):
                pass
        except BlockingIOError:
            pass
        return super().receive(timeout)
