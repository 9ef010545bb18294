"""`kubeinfer generate` as a user runs it: the demo model is built on first use, text streams out."""
import os
import subprocess
import sys


def run_cli(*args, cache):
    env = {**os.environ, "XDG_CACHE_HOME": str(cache)}
    return subprocess.run([sys.executable, "-m", "kubeinfer.runtime.cli", *args], env=env, capture_output=True,
                          text=True, timeout=300)


def test_generate_with_the_demo_model(tmp_path):
    result = run_cli("generate", "--model", "demo", "--prompt", "Hello, Kubernetes", "--max-tokens", "8",
                     cache=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("Hello, Kubernetes") and len(result.stdout) > len("Hello, Kubernetes\n")
    assert "random" in result.stderr and "loading weights" in result.stderr
    assert (tmp_path / "kubeinfer" / "demo-model-v1" / "model.safetensors").is_file()


def test_generate_reports_bad_input_without_a_traceback(tmp_path, llama_dir):
    result = run_cli("generate", "--model", str(llama_dir), "--prompt", "x", "--top-p", "2", cache=tmp_path)
    assert result.returncode == 2
    assert "top_p must be in (0, 1]" in result.stderr and "Traceback" not in result.stderr


def test_manifests_and_operator_subcommands_dispatch(tmp_path):
    import yaml
    result = run_cli("manifests", cache=tmp_path)
    assert result.returncode == 0, result.stderr
    kinds = {doc["kind"] for doc in yaml.safe_load_all(result.stdout) if doc}
    assert {"CustomResourceDefinition", "ClusterRole", "Deployment"} <= kinds
    helped = run_cli("operator", "--help", cache=tmp_path)
    assert helped.returncode == 0 and "--standalone" in helped.stdout


def test_an_unusable_cache_folder_is_one_line_without_a_traceback(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    result = run_cli("generate", "--model", "demo", "--prompt", "x", cache=blocker / "cache")
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    error_lines = [line for line in result.stderr.splitlines() if line.startswith("kubeinfer: error:")]
    assert len(error_lines) == 1 and "cannot build the demo model in" in error_lines[0]
    assert "XDG_CACHE_HOME" in error_lines[0]


def test_a_baked_demo_folder_is_used_and_never_rebuilt(tmp_path, monkeypatch):
    from kubeinfer.runtime import demo
    baked = tmp_path / "baked"
    monkeypatch.setenv(demo.DEMO_DIR_ENV, str(baked))
    assert demo.resolve_model_dir("demo") == baked and (baked / "model.safetensors").is_file()
    stamp = (baked / "model.safetensors").stat().st_mtime_ns
    assert demo.resolve_model_dir("demo") == baked
    assert (baked / "model.safetensors").stat().st_mtime_ns == stamp


def test_os_errors_read_as_what_failed_on_which_path():
    from kubeinfer.runtime.cli import os_error_line
    assert os_error_line(PermissionError(13, "Permission denied", "/models/m/config.json")) == \
        "cannot access /models/m/config.json: Permission denied"
    assert os_error_line(OSError("disk on fire")) == "cannot access: OSError: disk on fire"


def test_no_priority_preemption_reaches_the_engine_settings(monkeypatch):
    from kubeinfer.runtime.cli import build_parser, engine_settings
    parse = lambda *flags: engine_settings(build_parser().parse_args(["serve", "--model", "m", *flags]))  # noqa: E731
    assert parse()["priority_preemption"] is True
    assert parse("--no-priority-preemption")["priority_preemption"] is False
    monkeypatch.setenv("KUBEINFER_PRIORITY_PREEMPTION", "false")
    assert parse()["priority_preemption"] is False
