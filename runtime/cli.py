"""`kubeinfer` command line: `generate` (offline, streamed), `serve` (HTTP API), `router` and `operator`."""
import argparse
import dataclasses
import logging
import os
import sys
import time

from kubeinfer.runtime.cli_lines import (add_tracing_args, add_trusted_header_args, comma_list,
                                         log_level as _log_level, os_error_line, parse_lora_modules, port_number,
                                         start_tracing)
from kubeinfer.runtime.cli_pool import add_pool_parser
from kubeinfer.runtime.cli_router import add_router_parser
from kubeinfer.runtime.errors import ConfigError, KubeinferError

STARTED_AT = time.monotonic()   # for the start-up phases of `serve` (the interpreter's own start is not counted)

# Engine settings exposed as flags: (name, type, help). Each flag's default is read from KUBEINFER_<NAME>.
ENGINE_FLAGS = [
    ("dtype", str, "auto | float32 | float16 | bfloat16 (auto: the checkpoint's)"),
    ("max_model_len", int, "most tokens per sequence, prompt and output (default: the model's limit)"),
    ("block_size", int, "tokens per KV cache block"),
    ("max_num_seqs", int, "most sequences in one step"),
    ("max_num_batched_tokens", int, "token budget of one step; longer prompts are prefilled in chunks"),
    ("scheduling_policy", str, "the waiting queue's order: fcfs (arrival), shortest-first (arrival plus the prompt's "
                               "own prefill time: a burst's short prompts start first; none starves) or fair (strict "
                               "priority classes, then a weighted fair share of tokens between API keys)"),
    ("num_kvcache_blocks", int, "KV cache size in blocks (overrides the memory budget)"),
    ("kv_cache_memory_gib", float, "KV cache memory budget in GiB"),
    ("gpu_memory_utilization", float, "share of GPU memory the runtime may use"),
    ("cpu_memory_utilization", float, "on CPU: share of the host memory the engine may use (none: 0.9 of its "
                                      "cgroup's limit, else 0.5 of the machine's); the KV cache gets it less what is "
                                      "in use and a margin"),
    ("device", str, "auto | cpu | cuda[:N]"),
    ("kernel_backend", str, "auto | torch | triton | cpu"),
    ("tensor_parallel_size", int, "shard the model over N processes, one per GPU (gloo on CPU)"),
    ("expert_parallel_size", int, "a mixture-of-experts model's experts split whole over N processes (num_experts / N "
                                  "each): N = tensor_parallel_size, or with tensor_parallel_size 1 attention is "
                                  "replicated on N processes"),
    ("cuda_graph_max_batch_size", int, "largest decode batch replayed from a CUDA graph"),
    ("load_format", str, "auto | dummy (random weights of the model's shape, for benchmarks)"),
    ("weight_cache_dir", str, "a node-local folder where each model is kept as the engine holds it (converted, "
                              "packed): a later start on the node loads it from there instead of the checkpoint"),
    ("kv_cache_dtype", str, "auto (the model's dtype; fp32 for an fp16 model on the CPU) | float32 | "
                            "bfloat16 | float16 | fp8_e4m3 (8-bit K/V: twice the tokens of a 16-bit cache)"),
    ("speculative_method", str, "ngram: speculative decoding by prompt lookup; draft: by a small draft model "
                                "(--speculative-model); none: off"),
    ("speculative_model", str, "the draft model's folder (same tokenizer as the model), for speculative_method draft"),
    ("speculative_tokens", int, "tokens proposed per sequence and step, verified in one forward"),
    ("speculative_ngram_min", int, "shortest suffix of the context looked up earlier in it (ngram)"),
    ("speculative_ngram_max", int, "longest suffix of the context looked up earlier in it (ngram)"),
    ("cpu_threads", int, "torch threads on CPU (none: the CPUs this process may use, from its cgroup quota "
                         "and affinity; OMP_NUM_THREADS also works)"),
    ("max_loras", int, "LoRA adapters in one batch (0: LoRA off; docs/lora.md)"),
    ("max_lora_rank", int, "the largest LoRA rank served"),
    ("max_cpu_loras", int, "LoRA adapters kept in host memory (none: max(max_loras, 8))"),
]
BOOL_FLAGS = ["enable_prefix_caching", "enforce_eager", "enable_expert_parallel", "priority_preemption",
              "structured_loop_guard", "kv_prefault"]


def _env_bool(name: str, default: bool) -> bool:
    value = _env(name)
    return default if value is None else value.lower() not in ("0", "false", "no")


def _env(name: str, default=None):
    return os.environ.get(f"KUBEINFER_{name.upper()}", default)


def _typed_env(name: str, kind, default):
    """`KUBEINFER_<NAME>` converted to the flag's type (or `default`); a bad value is one ConfigError line."""
    raw = _env(name)
    if raw is None:
        return default
    try:
        return kind(raw)
    except ValueError:
        expected = {int: "an integer", float: "a number"}.get(kind, kind.__name__)
        raise ConfigError(f"KUBEINFER_{name.upper()}={raw!r}: expected {expected}") from None


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=_env("model"), required=_env("model") is None,
                        help="Hugging Face model folder, or 'demo' for the built-in random-weight demo model "
                             "[env KUBEINFER_MODEL]")
    defaults = {f.name: f.default for f in dataclasses.fields(_engine_config_class()) if f.init}
    for name, kind, help_text in ENGINE_FLAGS:
        parser.add_argument("--" + name.replace("_", "-"), dest=name, type=kind,
                            default=_typed_env(name, kind, defaults[name]),
                            help=f"{help_text} [env KUBEINFER_{name.upper()}; default {defaults[name]}]")
    parser.add_argument("--no-enable-prefix-caching", dest="enable_prefix_caching", action="store_false",
                        default=_env_bool("enable_prefix_caching", True),
                        help="turn off prefix caching [env KUBEINFER_ENABLE_PREFIX_CACHING]")
    parser.add_argument("--no-priority-preemption", dest="priority_preemption", action="store_false",
                        default=_env_bool("priority_preemption", True),
                        help="fair policy: a higher class waits for room instead of preempting lower ones (still "
                             "admitted first) [env KUBEINFER_PRIORITY_PREEMPTION]")
    parser.add_argument("--no-structured-loop-guard", dest="structured_loop_guard", action="store_false",
                        default=_env_bool("structured_loop_guard", True),
                        help="let a constrained answer repeat one block of tokens a 4th time (16+ tokens), a string "
                             "go on repeating its own phrases and an object take members after a repeated key: for "
                             "outputs that really repeat, at the risk of loops to max_tokens (docs/server.md) "
                             "[env KUBEINFER_STRUCTURED_LOOP_GUARD]")
    parser.add_argument("--kv-prefault", dest="kv_prefault", action="store_true",
                        default=_env_bool("kv_prefault", False),
                        help="on CPU, commit the KV pool's memory at start-up instead of as it fills: no request "
                             "pays a page's first touch (slow on lazily backed VMs) [env KUBEINFER_KV_PREFAULT]")
    parser.add_argument("--enforce-eager", dest="enforce_eager", action="store_true",
                        default=_env_bool("enforce_eager", False),
                        help="no CUDA graphs: run every decode step eagerly [env KUBEINFER_ENFORCE_EAGER]")
    parser.add_argument("--lora-modules", nargs="+", default=(_env("lora_modules") or "").split(), metavar="NAME=PATH",
                        help="LoRA adapters served from the start (PEFT folders) [env KUBEINFER_LORA_MODULES]")
    parser.add_argument("--enable-expert-parallel", dest="enable_expert_parallel", action="store_true",
                        default=_env_bool("enable_expert_parallel", False),
                        help="split a mixture-of-experts model's experts over the tensor-parallel ranks instead of "
                             "each expert's width [env KUBEINFER_ENABLE_EXPERT_PARALLEL]")


def engine_settings(args: argparse.Namespace) -> dict:
    names = [name for name, _, _ in ENGINE_FLAGS] + BOOL_FLAGS
    return {name: getattr(args, name) for name in names} | {"lora_modules": parse_lora_modules(args.lora_modules)}


def add_kv_args(serve: argparse.ArgumentParser) -> None:
    """Disaggregated serving (docs/disaggregation.md): the replica's role and its KV endpoint."""
    defaults = {f.name: f.default for f in dataclasses.fields(_engine_config_class()) if f.init}
    for flag, name, kind, help_text in [
        ("kv-role", "kv_role", str, "prefill: serve prompts' KV to decode replicas on --kv-port; decode: take "
                                    "requests whose KV the router names (kubeinfer_kv_source); none"),
        ("kv-host", "kv_host", str, "prefill: the address the KV endpoint listens on"),
        ("kv-port", "kv_port", int, "prefill: the KV endpoint's port (0: any free one)"),
        ("kv-idle-timeout", "kv_idle_timeout_s", float, "seconds of silence from the other side that end a transfer"),
    ]:
        choices = ("prefill", "decode", "none") if flag == "kv-role" else None
        serve.add_argument("--" + flag, dest=name, type=kind, default=_typed_env(name, kind, defaults[name]),
                           choices=choices,
                           help=f"{help_text} [env KUBEINFER_{name.upper()}; default {defaults[name]}]")
    networks = _env("kv_source_networks")
    serve.add_argument("--kv-source-networks", dest="kv_source_networks",
                       default=comma_list(networks) if networks else list(defaults["kv_source_networks"]),
                       type=comma_list,
                       help="decode: the networks (CIDR, comma-separated) a request's KV source may be in "
                            "[env KUBEINFER_KV_SOURCE_NETWORKS; default private networks and loopback]")
    serve.add_argument("--kv-source-key-file", default=_env("kv_source_key_file"), metavar="PATH",
                       help="decode: a key shared with the router (its --kv-source-key-file): a KV source is taken only "
                            "with the router's signature [env KUBEINFER_KV_SOURCE_KEY_FILE; default: none, unsigned]")


def kv_settings(args: argparse.Namespace) -> dict:
    names = ("kv_role", "kv_host", "kv_port", "kv_idle_timeout_s", "kv_source_key_file")
    return {name: getattr(args, name) for name in names} | {"kv_source_networks": tuple(args.kv_source_networks)}


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
                          max_waiting_requests=args.max_waiting_requests, tool_call_parser=args.tool_call_parser,
                          json_layout=args.json_layout, prefix_cache_sharing=args.prefix_cache_sharing,
                          lora_modules_file=args.lora_modules_file, trusted_tenant_header=args.trusted_tenant_header,
                          trusted_tenant_networks=tuple(args.trusted_tenant_networks),
                          **engine_settings(args), **kv_settings(args))
    start_tracing("kubeinfer-server", args.otlp_traces_endpoint)
    return serve(config, args.host, args.port, args.api_keys_file, args.default_tokens_per_minute,
                 args.drain_timeout_seconds, args.log_level, args.engine_mode, args.vllm_metrics, STARTED_AT,
                 args.sleep_at_start)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kubeinfer", description="LLM inference runtime and Kubernetes operator")
    parser.add_argument("--log-level", default=_env("log_level", "INFO"), help="logging level [env KUBEINFER_LOG_LEVEL]")
    commands = parser.add_subparsers(dest="command", required=True)
    generate = commands.add_parser("generate", help="generate text offline from a local model, streamed")
    add_engine_args(generate)
    generate.add_argument("--prompt", action="append", required=True, help="a prompt (repeat for several)")
    generate.add_argument("--max-tokens", type=int, default=64, help="tokens to generate per prompt [default 64]")
    generate.add_argument("--temperature", type=float, default=0.0, help="0 = greedy [default 0]")
    generate.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling, in (0, 1] [default 1]")
    generate.add_argument("--top-k", type=int, default=-1, help="-1 = off [default -1]")
    generate.add_argument("--seed", dest="sampling_seed", type=int, default=None,
                          help="sampling seed [default: none]")
    generate.add_argument("--stop", action="append", help="a stop string (repeat for several)")
    generate.add_argument("--ignore-eos", action="store_true", help="do not stop at the end-of-sequence token")
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
        ("engine-mode", str, "process", "process: the engine in its own process (default); thread: in this one"),
        ("tool-call-parser", str, "hermes", "format of the model's tool calls under tool_choice auto"),
        ("json-layout", str, "model", "structured output's whitespace: model (the model's own, bounded) or compact"),
        ("lora-modules-file", str, None, "a file holding `--lora-modules NAME=PATH ...`, watched: adapters are "
                                          "loaded and unloaded as it changes (docs/lora.md)"),
        ("sleep-at-start", int, 0, "1 or 2: go to sleep at that level once serving (a model pool's members, "
                                   "docs/router.md); 0: stay awake"),
        ("prefix-cache-sharing", str, "tenant", "whose prefix cache blocks a request may reuse: tenant (its API key's "
                                                "tenant's, or its cache_group's) or shared (everyone's)"),
    ]:
        name = flag.replace("-", "_")
        kind = port_number if flag == "port" else kind
        choices = {"engine-mode": ("process", "thread"), "tool-call-parser": ("hermes", "llama3_json"),
                   "json-layout": ("model", "compact"), "prefix-cache-sharing": ("tenant", "shared"),
                   "sleep-at-start": (0, 1, 2)}.get(flag)
        serve.add_argument("--" + flag, dest=name, type=kind, default=_typed_env(name, kind, default),
                           choices=choices, help=f"{help_text} [env KUBEINFER_{name.upper()}; default {default}]")
    add_kv_args(serve)
    add_trusted_header_args(serve)
    add_tracing_args(serve)
    serve.add_argument("--no-vllm-metrics", dest="vllm_metrics", action="store_false",
                       default=_env_bool("vllm_metrics", True),
                       help="do not also expose the gauges under vLLM's names (vllm:num_requests_waiting, ...) "
                            "that gateways read [env KUBEINFER_VLLM_METRICS]")
    serve.set_defaults(run=_serve)
    add_router_parser(commands)
    add_pool_parser(commands)
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
    try:
        args = build_parser().parse_args(argv)
        logging.basicConfig(level=_log_level(args.log_level), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        sys.exit(args.run(args))
    except KubeinferError as error:
        print(f"kubeinfer: error: {error}", file=sys.stderr)
        sys.exit(2)
    except OSError as error:
        # A model folder mounted without read permission, a full or read-only disk: one line, no traceback.
        print(f"kubeinfer: error: {os_error_line(error)}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
