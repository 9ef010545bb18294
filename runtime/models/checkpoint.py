"""Reads safetensors checkpoints straight into the model's parameters.

A safetensors file is an 8-byte little-endian header length, a JSON header (`name: {dtype, shape,
data_offsets}`) and the tensors' bytes, each contiguous and row-major. So a range of rows of a tensor is one
range of bytes, and a parameter (or a row range of it: a tensor-parallel shard, the q/k/v part of a fused
projection) of the checkpoint's dtype can be filled by `pread` into its own memory: one copy, from the page
cache into the final tensor, with no intermediate tensor and no mapping of the file. The reads are split into
chunks and run on a small thread pool (`pread` releases the GIL), so a cold read keeps several requests in
flight and a warm one copies on several cores. What the fast path cannot do (a column range, another dtype,
a GPU parameter) reads the rows into a temporary CPU tensor and copies from it.
"""
import json
import os
import struct
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import torch

from kubeinfer.runtime.errors import ModelLoadError

DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
}
CHUNK_BYTES = 16 * 2**20
# Enough requests in flight for a disk, and a copy per core from the page cache (measured in
# docs/benchmarks.md: 2 cores, 1B-shaped bf16 checkpoint).
NUM_READ_THREADS = 8
MAX_HEADER_BYTES = 100 * 2**20


class CheckpointReader:
    """Opens the checkpoint files of one load and runs their reads; `wait()` blocks until every read queued
    so far is done (and raises the first error). Use as a context manager."""

    def __init__(self, num_threads: int | None = None):
        num_threads = NUM_READ_THREADS if num_threads is None else num_threads
        self.pool = ThreadPoolExecutor(num_threads, thread_name_prefix="weights") if num_threads > 1 else None
        self.pending: list[Future] = []
        self.fds: list[int] = []

    def open(self, path: Path) -> "CheckpointFile":
        fd = os.open(path, os.O_RDONLY)
        self.fds.append(fd)
        return CheckpointFile(path, fd, self)

    def read(self, fd: int, dest: memoryview, offset: int) -> list[Future]:
        """Queues the read of `len(dest)` bytes at `offset` into `dest`, in chunks; returns their futures."""
        futures = []
        for start in range(0, len(dest), CHUNK_BYTES):
            chunk = dest[start:start + CHUNK_BYTES]
            if self.pool is None:
                _pread_exactly(fd, chunk, offset + start)
            else:
                futures.append(self.pool.submit(_pread_exactly, fd, chunk, offset + start))
        self.pending += futures
        return futures

    def wait(self) -> None:
        pending, self.pending = self.pending, []
        for future in pending:
            future.result()

    def __enter__(self) -> "CheckpointReader":
        return self

    def __exit__(self, *exc_info) -> None:
        try:
            if exc_info[0] is None:
                self.wait()
        finally:
            for future in self.pending:
                future.cancel()
            if self.pool is not None:
                self.pool.shutdown(wait=True)
            for fd in self.fds:
                os.close(fd)


class CheckpointFile:
    """The header of one safetensors file, checked against the file's size."""

    def __init__(self, path: Path, fd: int, reader: CheckpointReader):
        self.path, self.fd, self.reader = path, fd, reader
        size = os.fstat(fd).st_size
        raw = os.pread(fd, 8, 0)
        if len(raw) < 8:
            raise ModelLoadError(f"{path.name}: not a safetensors file ({size} bytes)")
        (header_len,) = struct.unpack("<Q", raw)
        if header_len > min(MAX_HEADER_BYTES, size - 8):
            raise ModelLoadError(f"{path.name}: not a safetensors file (header of {header_len} bytes)")
        try:
            header = json.loads(os.pread(fd, header_len, 8))
        except ValueError as error:
            raise ModelLoadError(f"{path.name}: not a safetensors file (bad header: {error})") from error
        header.pop("__metadata__", None)
        data_start = 8 + header_len
        self.tensors: dict[str, TensorSource] = {}
        for name, info in header.items():
            try:
                dtype = DTYPES[info["dtype"]]
                shape = tuple(int(n) for n in info["shape"])
                begin, end = (int(n) for n in info["data_offsets"])
            except (KeyError, TypeError, ValueError) as error:
                raise ModelLoadError(f"{path.name}: tensor {name}: unsupported or malformed entry {info!r}") from error
            numel = 1
            for n in shape:
                numel *= n
            if end - begin != numel * dtype.itemsize or begin < 0 or data_start + end > size:
                raise ModelLoadError(f"{path.name}: tensor {name}: bytes {begin}..{end} do not hold {dtype} "
                                     f"{list(shape)} within the file's {size} bytes (truncated file?)")
            self.tensors[name] = TensorSource(self, name, dtype, shape, data_start + begin)

    def keys(self) -> list[str]:
        return list(self.tensors)


class TensorSource:
    """One checkpoint tensor, as weight loaders take it: `get_shape()`, indexing (reads just that range,
    into a new tensor) and `read_into(dest, rows)` (reads rows into `dest` itself when it can)."""

    def __init__(self, file: CheckpointFile, name: str, dtype: torch.dtype, shape: tuple[int, ...], offset: int):
        self.file, self.name, self.dtype, self.shape, self.offset = file, name, dtype, shape, offset

    def get_shape(self) -> list[int]:
        return list(self.shape)

    def _rows(self, rows: slice) -> tuple[int, int]:
        if not self.shape:
            return 0, 1
        start, stop, step = rows.indices(self.shape[0])
        if step != 1:
            raise ValueError(f"{self.name}: strided row ranges are not supported")
        return start, max(start, stop)

    def _row_bytes(self) -> int:
        numel = 1
        for n in self.shape[1:]:
            numel *= n
        return numel * self.dtype.itemsize

    def read_into(self, dest: torch.Tensor, rows: slice = slice(None), what: str = "") -> None:
        """Fills `dest` with rows `rows` of this tensor. Queued on the reader when `dest` is a contiguous CPU
        tensor of this dtype (the caller must not read `dest` before `CheckpointReader.wait()`); otherwise
        read now and copied (converting the dtype, or to the device)."""
        start, stop = self._rows(rows)
        shape = (stop - start, *self.shape[1:]) if self.shape else ()
        if tuple(dest.shape) != shape:
            raise ValueError(f"{what or self.name}: checkpoint shard has shape {shape}, expected {tuple(dest.shape)}")
        if dest.device.type == "cpu" and dest.dtype == self.dtype and dest.is_contiguous():
            self._queue_read(dest, start, stop)
        else:
            dest.copy_(self[start:stop] if self.shape else self[:])

    def _queue_read(self, dest: torch.Tensor, start: int, stop: int) -> list[Future]:
        if dest.numel() == 0:
            return []
        row_bytes = self._row_bytes() if self.shape else self.dtype.itemsize
        view = memoryview(dest.view(-1).view(torch.uint8).numpy())   # dest's own memory, no copy
        return self.file.reader.read(self.file.fd, view, self.offset + start * row_bytes)

    def __getitem__(self, index) -> torch.Tensor:
        """`source[rows]` or `source[rows, cols]`: a new CPU tensor of the checkpoint's dtype."""
        rows, cols = (index if isinstance(index, tuple) else (index, None))
        start, stop = self._rows(rows if isinstance(rows, slice) else slice(rows, rows + 1))
        out = torch.empty((stop - start, *self.shape[1:]) if self.shape else (), dtype=self.dtype)
        for future in self._queue_read(out, start, stop):
            future.result()
        if not isinstance(rows, slice):
            out = out[0]
        return out if cols is None else out[..., cols]


def _pread_exactly(fd: int, dest: memoryview, offset: int) -> None:
    done = 0
    while done < len(dest):
        got = os.preadv(fd, [dest[done:]], offset + done)
        if got == 0:
            raise OSError(f"unexpected end of file at byte {offset + done}")
        done += got
