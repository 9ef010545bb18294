"""Every bad input a user can type gets one line that says what was expected, exit code 2, no traceback."""
import pytest

from kubeinfer.operator.install.manifests import find_helm
from support import run_kubeinfer


def assert_one_line_error(result, *expected: str, code: int = 2) -> None:
    assert result.returncode == code, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    # argparse prints its usage (wrapped, indented) before the error; `generate` a note on the demo model
    error_lines = [line for line in result.stderr.splitlines()
                   if line.strip() and not line.startswith(("usage:", " ", "note:"))]
    assert len(error_lines) == 1, result.stderr
    for text in expected:
        assert text in error_lines[0], result.stderr


@pytest.mark.parametrize("args, env, expected", [
    (["--num-kvcache-blocks", "0"], {}, ["num_kvcache_blocks must be >= 1, got 0"]),
    (["--kv-cache-memory-gib", "-1"], {}, ["kv_cache_memory_gib must be > 0"]),
    ([], {"KUBEINFER_MAX_NUM_SEQS": "abc"}, ["KUBEINFER_MAX_NUM_SEQS='abc': expected an integer"]),
    ([], {"KUBEINFER_GPU_MEMORY_UTILIZATION": "most"}, ["KUBEINFER_GPU_MEMORY_UTILIZATION='most': expected a number"]),
    (["--load-format", "npz"], {}, ["load_format must be one of auto, dummy"]),
    (["--cpu-memory-utilization", "1.5"], {}, ["cpu_memory_utilization must be in (0, 1]"]),
], ids=["kv-blocks-0", "kv-memory-negative", "env-not-an-integer", "env-not-a-number", "load-format",
        "cpu-memory-share"])
def test_bad_engine_settings(tmp_path, llama_dir, args, env, expected):
    result = run_kubeinfer("generate", "--model", str(llama_dir), "--prompt", "x", *args, env=env, cache=tmp_path)
    assert_one_line_error(result, *expected)


def test_cuda_device_without_cuda(tmp_path, llama_dir):
    import torch
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    result = run_kubeinfer("generate", "--model", str(llama_dir), "--prompt", "x", "--device", "cuda", cache=tmp_path)
    assert_one_line_error(result, "device 'cuda': no CUDA device is available here", "use --device cpu or auto")


@pytest.mark.parametrize("args, expected", [
    (["--port", "-1"], ["argument --port: a port is 1-65535, got -1"]),
    (["--port", "70000"], ["a port is 1-65535, got 70000"]),
    (["--engine-mode", "fiber"], ["argument --engine-mode: invalid choice: 'fiber'"]),
    (["--kv-role", "middle"], ["argument --kv-role: invalid choice: 'middle'"]),
    (["--kv-role", "decode", "--kv-source-networks", "10.0.0.0/8,pods"],
     ["kv_source_networks: 'pods' is not a network (CIDR"]),
    (["--kv-role", "prefill", "--kv-port", "70000"], ["kv_port must be in [0, 65535], got 70000"]),
], ids=["port-negative", "port-too-large", "engine-mode", "kv-role", "kv-source-networks", "kv-port"])
def test_bad_serve_flags(tmp_path, llama_dir, args, expected):
    result = run_kubeinfer("serve", "--model", str(llama_dir), *args, cache=tmp_path)
    assert_one_line_error(result, *expected)


def test_api_keys_errors_come_before_the_model_loads(tmp_path, llama_dir):
    """A bad quota names the syntax of its source; nothing is loaded first (no 'loading weights' line)."""
    result = run_kubeinfer("serve", "--model", str(llama_dir), env={"KUBEINFER_API_KEYS": "alpha,beta:lots"},
                           cache=tmp_path)
    assert_one_line_error(result, "KUBEINFER_API_KEYS: entry 2 is not KEY or KEY:TOKENS_PER_MINUTE",
                          'KUBEINFER_API_KEYS="key1,key2:5000"')
    assert "lots" not in result.stderr and "loading weights" not in result.stderr
    keys = tmp_path / "keys"
    keys.write_text("# keys\nalpha 100\nbeta 0\n")
    result = run_kubeinfer("serve", "--model", str(llama_dir), "--api-keys-file", str(keys), cache=tmp_path)
    assert_one_line_error(result, f"API keys file {str(keys)!r}: line 3 is not KEY [TOKENS_PER_MINUTE] [tenant=NAME]")
    assert "loading weights" not in result.stderr
    result = run_kubeinfer("serve", "--model", str(llama_dir), "--api-keys-file", str(tmp_path / "none"),
                           cache=tmp_path)
    assert_one_line_error(result, "does not exist")


def test_bad_log_level(tmp_path):
    result = run_kubeinfer("--log-level", "loud", "generate", "--model", "demo", "--prompt", "x", cache=tmp_path)
    assert_one_line_error(result, "log level 'loud': expected debug, info")


@pytest.mark.parametrize("make_args, expected", [
    (lambda d: ["-f", str(d / "missing.yaml")], "values file"),
    (lambda d: ["-f", str(d / "broken.yaml")], "failed to parse"),
    (lambda d: ["-f", str(d / "list.yaml")], "failed to parse"),
    (lambda d: ["--set", "key"], 'key "key" has no value'),
    (lambda d: ["--set", "replicaCount=2", "--set", "peering.enabled=false"],
     "at '/peering/enabled': value must be true"),
    (lambda d: ["--set", "monitoring.podMonitor.enabled=true"],
     "at '/serviceMonitorMode': value must be 'never'"),
], ids=["missing-file", "malformed-yaml", "yaml-list", "set-no-value", "replicas-need-peering",
        "podmonitor-needs-no-servicemonitors"])
@pytest.mark.skipif(find_helm() is None, reason="helm not found (make install-test installs it); values need Helm")
def test_bad_manifests_input(tmp_path, make_args, expected):
    (tmp_path / "broken.yaml").write_text("runtimeImage: [\n")
    (tmp_path / "list.yaml").write_text("- a\n- b\n")
    result = run_kubeinfer("manifests", *make_args(tmp_path), cache=tmp_path)
    assert_one_line_error(result, "kubeinfer manifests:", expected)
