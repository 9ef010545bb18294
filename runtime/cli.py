"""`kubeinfer` command line: `generate` (offline, streamed), `serve` (HTTP API) and `operator`."""
import argparse
import dataclasses
import logging
import os
import sys

from kubeinfer.runtime.errors import KubeinferError

# Engine settings exposed as flags: (name, type, help). Each flag's default is read from KUBEINFER_<NAME>.
ENGINE_FLAGS = [
    ("dtype", str, "auto | float32 | float16 | bfloat16 (auto: the checkpoint's)"),
    ("max_model_len", int, "most tokens per sequence, prompt and output (default: the model's limit)"),
    ("block_size", int, "tokens per KV cache block"),
    ("max_num_seqs", int, "most sequences in one step"),
    ("max_num_batched_tokens", int, "token budget of one step; longer prompts are prefilled in chunks"),
    ("num_kvcache_blocks", int, "KV cache size in blocks (overrides the memory budget)"),
    ("kv_cache_memory_gib", float, "KV cache memory budget in GiB"),
    ("gpu_memory_utilization", float, "share of GPU memory the runtime may use"),
    ("device", str, "auto | cpu | cuda[:N]"),
    ("kernel_backend", str, "auto | torch | triton"),
    ("tensor_parallel_size", int, "shard the model over N processes, one per GPU (gloo on CPU)"),
]


def _env(name: str, default=None):
    return os.environ.get(f"KUBEINFER_{name.upper()}", default)


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=_env("model"), required=_env("model") is None,
                        help="Hugging Face model folder, or 'demo' for the built-in random-weight demo model")
    defaults = {f.name: f.default for f in dataclasses.fields(_engine_config_class()) if f.init}
    for name, kind, help_text in ENGINE_FLAGS:
        default = _env(name, defaults[name])
        parser.add_argument("--" + name.replace("_", "-"), dest=name, type=kind,
                            default=kind(default) if default is not None else None,
                            help=f"{help_text} [env KUBEINFER_{name.upper()}; default {defaults[name]}]")
    parser.add_argument("--no-enable-prefix-caching", dest="enable_prefix_caching", action="store_false",
                        default=_env("enable_prefix_caching", "true").lower() not in ("0", "false", "no"),
                        help="turn off prefix caching [env KUBEINFER_ENABLE_PREFIX_CACHING]")


def engine_settings(args: argparse.Namespace) -> dict:
    names = [name for name, _, _ in ENGINE_FLAGS] + ["enable_prefix_caching"]
    return {name: getattr(args, name) for name in names}


def _engine_config_class():
    from kubeinfer.runtime.config import EngineConfig
    return EngineConfig


def _generate(args: argparse.Namespace) -> int:
    from kubeinfer.runtime.demo import DEMO_NAME
    from kubeinfer.runtime.llm import LLM
    from kubeinfer.runtime.sampling_params import SamplingParams

    if args.model == DEMO_NAME:
        print("note: the demo model has random weights, so its text is random.", file=sys.stderr)
    llm = LLM(args.model, **engine_settings(args))
    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
                            top_k=args.top_k, seed=args.sampling_seed, stop=args.stop or [],
                            ignore_eos=args.ignore_eos)
    engine = llm.engine
    for index, prompt in enumerate(args.prompt):
        engine.add_request(str(index), prompt, params)
    streaming = len(args.prompt) == 1
    texts: dict[str, str] = {}
    if streaming:
        sys.stdout.write(args.prompt[0])
    while engine.has_unfinished_requests():
        for output in engine.step():
            if streaming:
                sys.stdout.write(output.new_text)
                sys.stdout.flush()
            elif output.finished:
                texts[output.request_id] = output.text
    if streaming:
        sys.stdout.write("\n")
    for index, prompt in enumerate(args.prompt if not streaming else []):
        print(f"--- prompt {index}: {prompt!r}\n{prompt}{texts[str(index)]}")
    return 0


def _serve(args: argparse.Namespace) -> int:
    from kubeinfer.runtime.config import EngineConfig
    from kubeinfer.runtime.server.main import serve

    config = EngineConfig(model=args.model, served_model_name=args.served_model_name,
                          max_waiting_requests=args.max_waiting_requests, **engine_settings(args))
    return serve(config, args.host, args.port, args.api_keys_file, args.default_tokens_per_minute,
                 args.drain_timeout_seconds, args.log_level)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kubeinfer", description="LLM inference runtime and Kubernetes operator")
    parser.add_argument("--log-level", default=_env("log_level", "INFO"), help="logging level [env KUBEINFER_LOG_LEVEL]")
    commands = parser.add_subparsers(dest="command", required=True)
    generate = commands.add_parser("generate", help="generate text offline from a local model, streamed")
    add_engine_args(generate)
    generate.add_argument("--prompt", action="append", required=True, help="a prompt (repeat for several)")
    generate.add_argument("--max-tokens", type=int, default=64)
    generate.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    generate.add_argument("--top-p", type=float, default=1.0)
    generate.add_argument("--top-k", type=int, default=-1)
    generate.add_argument("--seed", dest="sampling_seed", type=int, default=None, help="sampling seed")
    generate.add_argument("--stop", action="append", help="a stop string (repeat for several)")
    generate.add_argument("--ignore-eos", action="store_true")
    generate.set_defaults(run=_generate)
    serve = commands.add_parser("serve", help="serve the OpenAI-compatible HTTP API")
    add_engine_args(serve)
    for flag, kind, default, help_text in [
        ("served-model-name", str, None, "model name clients send (default: the model folder's name)"),
        ("host", str, "0.0.0.0", "address to listen on"),
        ("port", int, 8000, "port to listen on"),
        ("max-waiting-requests", int, 1024, "requests queued beyond the running batch before 429"),
        ("api-keys-file", str, None, "file of API keys, one per line: KEY [TOKENS_PER_MINUTE]"),
        ("default-tokens-per-minute", int, None, "token quota of keys that name none (default: none)"),
        ("drain-timeout-seconds", float, 30.0, "on SIGTERM, how long requests in flight may finish"),
    ]:
        name = flag.replace("-", "_")
        value = _env(name, default)
        serve.add_argument("--" + flag, dest=name, type=kind, default=kind(value) if value is not None else None,
                           help=f"{help_text} [env KUBEINFER_{name.upper()}]")
    serve.set_defaults(run=_serve)
    commands.add_parser("operator", help="run the InferenceService operator (flags: kubeinfer operator --help)",
                        add_help=False)
    commands.add_parser("manifests", help="print the install as plain YAML (flags: kubeinfer manifests --help)",
                        add_help=False)
    return parser


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["operator"]:
        from kubeinfer.operator.__main__ import main as operator_main
        operator_main(argv[1:])
        return
    if argv[:1] == ["manifests"]:
        from kubeinfer.operator.manifests import main as manifests_main
        manifests_main(argv[1:])
        return
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        sys.exit(args.run(args))
    except KubeinferError as error:
        print(f"kubeinfer: error: {error}", file=sys.stderr)
        sys.exit(2)
    except OSError as error:
        # A model folder mounted without read permission, a full or read-only disk: one line, no traceback.
        print(f"kubeinfer: error: {os_error_line(error)}", file=sys.stderr)
        sys.exit(2)


def os_error_line(error: OSError) -> str:
    """`[Errno 13] Permission denied: '/models/x/config.json'` in words: what failed, on which path."""
    what = error.strerror or type(error).__name__
    path = f" {error.filename}" if error.filename else ""
    detail = "" if error.strerror else f": {error}"
    return f"cannot access{path}: {what}{detail}"
if __name__ == "__main__":
    main()
