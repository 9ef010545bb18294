"""KV transfer throughput between two processes over loopback TCP, against the loopback TCP bandwidth measured in
the same run: plain `sendall` into `recv_into` of as many bytes, in pieces of a block's size, out of and into
buffers as large as the caches (like for like: KV blocks come from and go to memory, not the CPU's cache). It also
prints the loopback figure with one 2 MiB buffer sent again and again and received into one 4 MiB buffer: both stay
in the CPU's cache, an upper bound no KV transfer of this size can reach.

    python benchmarks/kv_transfer.py [--num-tokens 2048] [--trials 5] [--device cpu]

The KV side is the runtime's transport, unchanged: a prefill process serves a synthetic cache through
`TcpKVSource` (blocks handed out as the stream has room, as the exporter does), and this process pulls them with
`TcpKVPuller` into its own cache (per-frame crc32 on both sides, blocks written in place). The layout is
Llama-3-8B's (32 layers, 8 KV heads of 128, bf16, blocks of 16 tokens: 2 MiB a block). `--device cuda` puts both
caches on the GPU: each block then crosses device-to-host on one side and host-to-device on the other.
"""
import argparse
import multiprocessing
import socket
import statistics
import threading
import time

LAYOUT = dict(model="llama-3-8b-shaped", dtype="bfloat16", block_size=16, num_layers=32, num_kv_heads=8, head_dim=128)


def make_cache(num_blocks: int, device: str, fill: bool):
    import torch
    shape = (2, LAYOUT["num_layers"], num_blocks, LAYOUT["block_size"], LAYOUT["num_kv_heads"], LAYOUT["head_dim"])
    cache = torch.zeros(shape, dtype=torch.bfloat16, device=device)
    if fill:
        cache.normal_()
    return cache


def serve_kv(num_blocks: int, device: str, conn) -> None:
    """The prefill process: answers every pull with all its blocks, as fast as the stream takes them."""
    from kubeinfer.runtime.disagg.layout import KVLayout
    from kubeinfer.runtime.disagg.tcp_source import TcpKVSource
    cache = make_cache(num_blocks, device, fill=True)
    progress = threading.Event()
    source = TcpKVSource(KVLayout(**LAYOUT), cache, "127.0.0.1")

    def on_pull(request, stream):
        def pump():
            for index in range(request.num_skip_blocks, num_blocks):
                while True:
                    progress.clear()   # before looking: a block sent after the look sets it again
                    if stream.room() > 0 or stream.error is not None:
                        break
                    progress.wait()
                stream.send_block(index, index)
            stream.finish(0)
        threading.Thread(target=pump, daemon=True).start()
    source.start(on_pull, progress.set)
    conn.send(source.address)
    conn.recv()   # until told to stop


def serve_plain(total_bytes: int, block_bytes: int, hot: bool, conn) -> None:
    """The plain TCP sender: `total_bytes` in `block_bytes` pieces to whoever connects, once per connection, out of
    one buffer of `total_bytes` (or, `hot`, of `block_bytes`, sent again and again)."""
    listener = socket.create_server(("127.0.0.1", 0))
    conn.send("127.0.0.1:%d" % listener.getsockname()[1])
    payload = memoryview(bytearray(block_bytes if hot else total_bytes))
    while True:
        client, _ = listener.accept()
        with client:
            for start in range(0, total_bytes, block_bytes):
                client.sendall(payload[0:block_bytes] if hot else payload[start:start + block_bytes])


def plain_transfer(address: str, buffer: memoryview, total_bytes: int, block_bytes: int) -> float:
    """Receives `total_bytes` into `buffer` (wrapping around when it is smaller) in pieces of `block_bytes`."""
    host, port = address.split(":")
    started = time.perf_counter()
    with socket.create_connection((host, int(port))) as sock:
        received = 0
        while received < total_bytes:
            offset = received % len(buffer)
            received += sock.recv_into(buffer[offset:offset + min(block_bytes, len(buffer) - offset)])
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-tokens", type=int, default=2048)
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    from kubeinfer.runtime.disagg.connector import PullRequest
    from kubeinfer.runtime.disagg.layout import KVLayout
    from kubeinfer.runtime.disagg.tcp_puller import TcpKVPuller
    layout = KVLayout(**LAYOUT)
    num_blocks = -(-args.num_tokens // layout.block_size)
    total = num_blocks * layout.block_bytes
    spawn = multiprocessing.get_context("spawn")
    kv_end, kv_child = spawn.Pipe()
    kv_process = spawn.Process(target=serve_kv, args=(num_blocks, args.device, kv_child), daemon=True)
    kv_process.start()
    plain_addresses, plain_processes = {}, []
    for hot in (False, True):
        plain_end, plain_child = spawn.Pipe()
        plain_processes.append(spawn.Process(target=serve_plain, args=(total, layout.block_bytes, hot, plain_child),
                                             daemon=True))
        plain_processes[-1].start()
        plain_addresses[hot] = plain_end.recv()
    kv_address = kv_end.recv()
    cache = make_cache(num_blocks, args.device, fill=False)
    plain_buffers = {False: memoryview(bytearray(total)), True: memoryview(bytearray(2 * layout.block_bytes))}
    puller = TcpKVPuller(layout, cache)
    request = PullRequest([0] * args.num_tokens, {})
    print(f"{num_blocks} blocks of {layout.block_bytes / 2**20:.1f} MiB ({total / 2**30:.2f} GiB) per transfer, "
          f"device {args.device}")
    plain_rates, hot_rates, kv_rates = [], [], []
    for trial in range(args.trials + 1):   # the first round warms up (page faults of the buffers), not counted
        plain_seconds = plain_transfer(plain_addresses[False], plain_buffers[False], total, layout.block_bytes)
        hot_seconds = plain_transfer(plain_addresses[True], plain_buffers[True], total, layout.block_bytes)
        started = time.perf_counter()
        puller.pull(kv_address, request, list(range(num_blocks)))
        if args.device != "cpu":
            import torch
            torch.cuda.synchronize()
        kv_seconds = time.perf_counter() - started
        if trial:
            plain_rates.append(total / plain_seconds / 1e9)
            hot_rates.append(total / hot_seconds / 1e9)
            kv_rates.append(total / kv_seconds / 1e9)
            print(f"trial {trial}: loopback TCP {plain_rates[-1]:.2f} GB/s (in-cache buffers {hot_rates[-1]:.2f}), "
                  f"KV transfer {kv_rates[-1]:.2f} GB/s")
    plain, hot, kv = (statistics.median(rates) for rates in (plain_rates, hot_rates, kv_rates))
    print(f"median: loopback TCP {plain:.2f} GB/s, KV transfer {kv:.2f} GB/s = {kv / plain:.0%} of loopback "
          f"(in-cache loopback {hot:.2f} GB/s: {kv / hot:.0%})")
    kv_end.send("stop")
    kv_process.join(5)
    for process in plain_processes:
        process.terminate()


if __name__ == "__main__":
    main()
