"""Each spec field's effect on the desired Deployment, Service, PDB and ServiceMonitor."""

from __future__ import annotations

import hashlib
import re
from typing import Any

import pytest

from kubeinfer.operator.config import OperatorConfig
from kubeinfer.operator.reconcile import builders, model_cache, pod
from kubeinfer.operator.spec import parse_spec

OWNER = builders.Owner(name="qwen", namespace="ml", uid="0000-1111")
CONFIG = OperatorConfig()


def build(**spec: Any) -> dict[str, Any]:
    raw = {"model": {"uri": "pvc://models/qwen"}, **spec}
    return builders.deployment(parse_spec(raw), OWNER, CONFIG)


def container(dep: dict[str, Any]) -> dict[str, Any]:
    return dep["spec"]["template"]["spec"]["containers"][0]


def flag(dep: dict[str, Any], name: str) -> str | None:
    args = container(dep)["args"]
    return args[args.index(name) + 1] if name in args else None


def volume(dep: dict[str, Any], name: str) -> dict[str, Any] | None:
    return next((v for v in dep["spec"]["template"]["spec"]["volumes"] if v["name"] == name), None)


def mount(dep: dict[str, Any], path: str) -> dict[str, Any] | None:
    return next((m for m in container(dep)["volumeMounts"] if m["mountPath"] == path), None)


@pytest.mark.parametrize("tensor", [1, 2, 8])
def test_gpu_count_follows_tensor_parallelism(tensor: int) -> None:
    dep = build(parallelism={"tensor": tensor})
    res = container(dep)["resources"]
    assert res["requests"]["nvidia.com/gpu"] == str(tensor)
    assert res["limits"]["nvidia.com/gpu"] == str(tensor)
    assert flag(dep, "--tensor-parallel-size") == str(tensor)


def test_cpu_is_requested_memory_requested_and_limited() -> None:
    res = container(build(resources={"cpu": "8", "memory": "64Gi"}))["resources"]
    assert res["requests"]["cpu"] == "8" and "cpu" not in res["limits"]
    assert res["requests"]["memory"] == res["limits"]["memory"] == "64Gi"


def test_zero_gpus_runs_on_cpu_with_the_kv_cache_sized_from_memory() -> None:
    dep = build(resources={"gpus": 0, "cpu": "2", "memory": "8Gi"})
    c, pod_spec = container(dep), dep["spec"]["template"]["spec"]
    assert c["resources"] == {"requests": {"cpu": "2", "memory": "8Gi"}, "limits": {"memory": "8Gi"}}
    assert flag(dep, "--device") == "cpu"
    assert flag(dep, "--kv-cache-memory-gib") == "2.0"            # a quarter of 8Gi
    assert "tolerations" not in pod_spec                           # no GPU taint to tolerate
    assert "nvidia.com/gpu" not in str(dep)


@pytest.mark.parametrize("cpu, tensor, threads", [("250m", 1, "1"), ("2", 1, "2"), ("2500m", 1, "3"), ("4", 2, "2"),
                                                  (None, 1, None)])
def test_cpu_pods_use_as_many_torch_threads_as_cpus_they_request(cpu, tensor, threads) -> None:
    resources = {"gpus": 0, **({"cpu": cpu} if cpu else {})}
    assert flag(build(resources=resources, parallelism={"tensor": tensor}), "--cpu-threads") == threads
    assert flag(build(resources={"cpu": "2"}), "--cpu-threads") is None    # GPU pods: the runtime decides


def test_cpu_kv_cache_is_split_over_tensor_parallel_processes_and_an_explicit_budget_wins() -> None:
    split = build(resources={"gpus": 0, "memory": "16Gi"}, parallelism={"tensor": 2})
    assert flag(split, "--kv-cache-memory-gib") == "2.0" and flag(split, "--tensor-parallel-size") == "2"
    explicit = build(resources={"gpus": 0, "memory": "16Gi"}, runtime={"kvCacheMemoryGib": 1.5})
    assert flag(explicit, "--kv-cache-memory-gib") == "1.5"


def test_cpu_without_memory_leaves_the_kv_cache_to_the_runtime_and_requests_nothing() -> None:
    dep = build(resources={"gpus": 0})
    assert flag(dep, "--kv-cache-memory-gib") is None and flag(dep, "--device") == "cpu"
    assert "resources" not in container(dep) or container(dep)["resources"] == {}


def test_gpu_replicas_keep_the_gpu_toleration_and_run_on_the_default_device() -> None:
    dep = build(resources={"gpus": 2}, parallelism={"tensor": 2})
    assert container(dep)["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert flag(dep, "--device") is None and flag(dep, "--kv-cache-memory-gib") is None
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in \
        dep["spec"]["template"]["spec"]["tolerations"]


def test_gpu_product_becomes_a_node_selector_beside_the_users() -> None:
    dep = build(resources={"gpuProduct": "NVIDIA-H100-80GB-HBM3"}, scheduling={"nodeSelector": {"pool": "gpu"}})
    assert dep["spec"]["template"]["spec"]["nodeSelector"] == {
        "pool": "gpu", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert "nodeSelector" not in build()["spec"]["template"]["spec"]


def test_runtime_fields_map_to_the_contract_flags() -> None:
    dep = build(model={"uri": "pvc://models/qwen", "servedName": "qwen-chat"}, runtime={
        "maxModelLen": 4096, "blockSize": 32, "maxNumSeqs": 64, "maxNumBatchedTokens": 1024, "dtype": "bfloat16",
        "maxWaitingRequests": 100, "gpuMemoryUtilization": 0.8, "kvCacheMemoryGib": 20, "drainTimeoutSeconds": 60,
        "kvCacheDtype": "fp8_e4m3", "schedulingPolicy": "shortest-first", "enablePrefixCaching": False,
        "extraArgs": ["--seed", "7"]})
    c = container(dep)
    assert c["command"] == ["kubeinfer", "serve"]
    expected = {"--served-model-name": "qwen-chat", "--port": "8000", "--host": "0.0.0.0", "--max-model-len": "4096",
                "--block-size": "32", "--max-num-seqs": "64", "--max-num-batched-tokens": "1024",
                "--dtype": "bfloat16", "--max-waiting-requests": "100", "--gpu-memory-utilization": "0.8",
                "--kv-cache-memory-gib": "20.0", "--drain-timeout-seconds": "60", "--kv-cache-dtype": "fp8_e4m3",
                "--scheduling-policy": "shortest-first"}
    assert {k: flag(dep, k) for k in expected} == expected
    assert "--no-enable-prefix-caching" in c["args"]
    assert c["args"][-2:] == ["--seed", "7"]


def test_speculative_decoding_maps_to_its_flags() -> None:
    dep = build(runtime={"speculative": {"method": "ngram", "numTokens": 6, "ngramMax": 3}})
    assert {k: flag(dep, k) for k in ("--speculative-method", "--speculative-tokens", "--speculative-ngram-min",
                                      "--speculative-ngram-max")} == {
        "--speculative-method": "ngram", "--speculative-tokens": "6", "--speculative-ngram-min": "2",
        "--speculative-ngram-max": "3"}
    assert "--speculative-method" not in container(build())["args"]
    draft = build(runtime={"speculative": {"method": "draft", "draftModelPath": "/models/draft"}})
    assert (flag(draft, "--speculative-method"), flag(draft, "--speculative-model")) == ("draft", "/models/draft")
    assert "--speculative-ngram-min" not in container(draft)["args"]


def test_expert_parallelism_maps_to_its_flag_and_must_match_tensor() -> None:
    dep = build(parallelism={"tensor": 4, "expert": 4})
    assert (flag(dep, "--tensor-parallel-size"), flag(dep, "--expert-parallel-size")) == ("4", "4")
    assert container(dep)["resources"]["limits"]["nvidia.com/gpu"] == "4"   # the GPUs of the tensor ranks
    assert "--expert-parallel-size" not in container(build(parallelism={"tensor": 4}))["args"]
    with pytest.raises(ValueError, match="parallelism.expert must be 1, equal parallelism.tensor"):
        parse_spec({"model": {"uri": "pvc://m/q"}, "parallelism": {"tensor": 2, "expert": 4}})


def test_expert_parallelism_with_replicated_attention_takes_one_gpu_per_expert_rank() -> None:
    dep = build(parallelism={"expert": 4})
    assert (flag(dep, "--tensor-parallel-size"), flag(dep, "--expert-parallel-size")) == ("1", "4")
    assert container(dep)["resources"]["limits"]["nvidia.com/gpu"] == "4"
    cpu = build(parallelism={"expert": 2}, resources={"gpus": 0, "cpu": "2", "memory": "8Gi"})
    assert flag(cpu, "--cpu-threads") == "1"   # two processes share the pod's two CPUs
    assert float(flag(cpu, "--kv-cache-memory-gib")) == 1.0   # a quarter of 8 GiB over two processes
    with pytest.raises(ValueError, match="resources.gpus must be 0 .run on CPU. or equal the larger"):
        parse_spec({"model": {"uri": "pvc://m/q"}, "parallelism": {"expert": 4}, "resources": {"gpus": 1}})


def test_defaults_leave_optional_flags_out_and_name_the_model_after_the_owner() -> None:
    dep = build()
    args = container(dep)["args"]
    assert flag(dep, "--served-model-name") == "qwen"
    for absent in ("--max-model-len", "--api-keys-file", "--no-enable-prefix-caching", "--gpu-memory-utilization",
                   "--kv-cache-dtype"):
        assert absent not in args
    assert container(dep)["image"] == CONFIG.runtime_image


def test_image_comes_from_spec_or_operator_setting() -> None:
    assert container(build(runtime={"image": "reg/rt:2"}))["image"] == "reg/rt:2"
    dep = builders.deployment(parse_spec({"model": {"uri": "file:///m"}}), OWNER, OperatorConfig(runtime_image="x/y:1"))
    assert container(dep)["image"] == "x/y:1"


def test_probes_and_startup_budget() -> None:
    c = container(build(runtime={"startupTimeoutSeconds": 1200}))
    assert c["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "http"}
    assert c["livenessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    startup = c["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 1200
    assert startup["periodSeconds"] * (startup["failureThreshold"] - 1) < 1200
    assert c["ports"] == [{"name": "http", "containerPort": 8000, "protocol": "TCP"}]


def test_drain_prestop_and_grace_period() -> None:
    dep = build(runtime={"drainTimeoutSeconds": 90})
    c = container(dep)
    sleep = int(c["lifecycle"]["preStop"]["exec"]["command"][1])
    grace = dep["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert sleep > 0 and grace > sleep + 90


def test_security_context_is_locked_down() -> None:
    dep = build(model={"uri": "hf://org/m"})
    spec = dep["spec"]["template"]["spec"]
    assert spec["securityContext"]["runAsNonRoot"] is True and spec["securityContext"]["runAsUser"] != 0
    for c in spec["containers"] + spec["initContainers"]:
        sc = c["securityContext"]
        assert sc["readOnlyRootFilesystem"] is True
        assert sc["allowPrivilegeEscalation"] is False
        assert sc["capabilities"] == {"drop": ["ALL"]}
    assert spec["automountServiceAccountToken"] is False
    assert spec["enableServiceLinks"] is False


def test_shm_and_tmp_are_writable_emptydirs() -> None:
    dep = build(resources={"shmSize": "16Gi"})
    assert volume(dep, "dshm") == {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}}
    assert mount(dep, "/dev/shm")["name"] == "dshm"
    assert mount(dep, "/tmp")["name"] == "tmp"


def test_pvc_uri_mounts_the_claim_read_only() -> None:
    dep = build(model={"uri": "pvc://model-store/meta/llama"})
    assert volume(dep, "model")["persistentVolumeClaim"] == {"claimName": "model-store", "readOnly": True}
    assert mount(dep, "/models")["readOnly"] is True
    assert flag(dep, "--model") == "/models/meta/llama"
    assert "initContainers" not in dep["spec"]["template"]["spec"]


def test_file_uri_uses_the_image_path_without_volume() -> None:
    dep = build(model={"uri": "file:///opt/models/tiny"})
    assert flag(dep, "--model") == "/opt/models/tiny"
    assert volume(dep, "model") is None
    assert "initContainers" not in dep["spec"]["template"]["spec"]


def test_hf_uri_downloads_in_an_init_container_into_an_emptydir() -> None:
    dep = build(model={"uri": "hf://Qwen/Qwen3-0.6B@v2", "credentialsSecret": "hf-token"})
    init = dep["spec"]["template"]["spec"]["initContainers"][0]
    script = init["command"][-1]
    assert "hf download Qwen/Qwen3-0.6B" in script and "--revision v2" in script
    assert "/models/weights" in script
    assert init["envFrom"] == [{"secretRef": {"name": "hf-token"}}]
    assert volume(dep, "model") == {"name": "model", "emptyDir": {}}
    assert flag(dep, "--model") == "/models/weights"


def test_s3_uri_syncs_into_a_cache_pvc_when_given() -> None:
    dep = build(model={"uri": "s3://bucket/llama", "cacheVolumeClaim": "weights-cache"})
    init = dep["spec"]["template"]["spec"]["initContainers"][0]
    folder = f"/models/{model_cache.cache_key('s3://bucket/llama')}"
    assert f"aws s3 sync s3://bucket/llama {folder}.partial --only-show-errors" in init["command"][-1]
    assert init["image"] == CONFIG.s3_downloader_image
    assert volume(dep, "model")["persistentVolumeClaim"] == {"claimName": "weights-cache"}
    assert flag(dep, "--model") == folder


def test_hf_uri_with_a_node_cache_downloads_once_per_node_into_a_folder_named_after_the_uri() -> None:
    dep = build(model={"uri": "hf://Qwen/Qwen3-0.6B@v2", "cacheHostPath": "/var/lib/kubeinfer/models"})
    assert volume(dep, "model") == {"name": "model", "hostPath": {"path": "/var/lib/kubeinfer/models",
                                                                  "type": "DirectoryOrCreate"}}
    folder = flag(dep, "--model")
    assert folder == "/models/hf-Qwen-Qwen3-0.6B-v2-" + hashlib.sha256(b"hf://Qwen/Qwen3-0.6B@v2").hexdigest()[:10]
    assert mount(dep, "/models")["readOnly"] is True
    init = dep["spec"]["template"]["spec"]["initContainers"][0]
    assert {"name": "model", "mountPath": "/models"} in init["volumeMounts"]   # writable for the download
    assert init["terminationMessagePolicy"] == "FallbackToLogsOnError"
    script = init["command"][-1].splitlines()
    # Under the lock, only if no replica finished it, into .partial; published by one rename when complete.
    assert script.index("flock 9") < script.index(
        f"hf download Qwen/Qwen3-0.6B --local-dir {folder}.partial --revision v2") < script.index(
        f"mv {folder}.partial {folder}")
    assert f"test -f {folder}/.kubeinfer-complete && exit 0" in script[1]
    assert any(line.startswith(f"test -f {folder}/.kubeinfer-complete && exit 0") for line in script[
        script.index("flock 9"):])
    # Another revision, another folder; the emptyDir (one pod's own) keeps the plain path.
    assert flag(build(model={"uri": "hf://Qwen/Qwen3-0.6B@v3", "cacheHostPath": "/c"}), "--model") != folder
    assert flag(build(model={"uri": "hf://Qwen/Qwen3-0.6B@v2"}), "--model") == "/models/weights"


def test_hf_downloads_run_in_the_pods_runtime_image_unless_the_operator_names_one() -> None:
    def init_image(config: OperatorConfig, **runtime: Any) -> str:
        spec = parse_spec({"model": {"uri": "hf://o/m"}, "runtime": runtime})
        return builders.deployment(spec, OWNER, config)["spec"]["template"]["spec"]["initContainers"][0]["image"]
    assert init_image(OperatorConfig(runtime_image="reg/rt:1")) == "reg/rt:1"
    assert init_image(OperatorConfig(runtime_image="reg/rt:1"), image="reg/own:2") == "reg/own:2"
    assert init_image(OperatorConfig(runtime_image="reg/rt:1", hf_downloader_image="reg/hf:3"), image="x") == "reg/hf:3"


@pytest.mark.parametrize("uri", ["hf://org/m;rm -rf /", "s3://b/$(reboot)", "hf://a/../../etc@`id`"])
def test_cache_folders_are_plain_names(uri: str) -> None:
    key = model_cache.cache_key(uri)
    assert re.fullmatch(r"[A-Za-z0-9._-]+", key) and not key.startswith(".")   # one path component, not hidden


def test_compile_caches_go_to_one_volume_an_emptydir_unless_a_node_directory_or_claim_is_named() -> None:
    dep = build()
    assert volume(dep, "compile-cache") == {"name": "compile-cache", "emptyDir": {}}
    assert mount(dep, "/var/cache/kubeinfer")["name"] == "compile-cache"
    env = {e["name"]: e.get("value") for e in container(dep)["env"]}
    assert env["TRITON_CACHE_DIR"] == "/var/cache/kubeinfer/triton"
    assert env["TORCHINDUCTOR_CACHE_DIR"] == "/var/cache/kubeinfer/torchinductor"
    assert env["CUDA_CACHE_PATH"] == "/var/cache/kubeinfer/cuda"
    assert env["KUBEINFER_KERNEL_CACHE_DIR"] == "/var/cache/kubeinfer/kernels"   # the native CPU kernels' builds
    node = build(runtime={"compileCache": {"hostPath": "/var/cache/kubeinfer"}})
    assert volume(node, "compile-cache")["hostPath"] == {"path": "/var/cache/kubeinfer", "type": "DirectoryOrCreate"}
    claim = build(runtime={"compileCache": {"volumeClaim": "kernels"}})
    assert volume(claim, "compile-cache")["persistentVolumeClaim"] == {"claimName": "kernels"}
    sized = build(runtime={"compileCache": {"sizeLimit": "2Gi"}})
    assert volume(sized, "compile-cache")["emptyDir"] == {"sizeLimit": "2Gi"}
    assert "KUBEINFER_WEIGHT_CACHE_DIR" not in env   # the weight cache is asked for
    weights = build(runtime={"compileCache": {"hostPath": "/var/cache/kubeinfer", "weights": True}})
    weights_env = {e["name"]: e.get("value") for e in container(weights)["env"]}
    assert weights_env["KUBEINFER_WEIGHT_CACHE_DIR"] == "/var/cache/kubeinfer/weights"


def test_uri_cannot_inject_shell() -> None:
    dep = build(model={"uri": "hf://org/m;rm -rf /"})
    script = dep["spec"]["template"]["spec"]["initContainers"][0]["command"][-1]
    assert "'org/m;rm -rf /'" in script


def test_api_key_secret_is_mounted_as_a_file() -> None:
    dep = build(apiKeySecretRef={"name": "keys", "key": "tokens"})
    assert volume(dep, "api-keys")["secret"]["secretName"] == "keys"
    assert volume(dep, "api-keys")["secret"]["items"] == [{"key": "tokens", "path": "keys"}]
    assert flag(dep, "--api-keys-file") == f"{mount(dep, pod.API_KEYS_DIR)['mountPath']}/keys"


def test_tenants_mount_their_secret_and_turn_the_fair_queue_on() -> None:
    dep = build(tenants={"secretRef": {"name": "teams", "key": "keys.txt"}})
    assert volume(dep, "api-keys")["secret"]["secretName"] == "teams"
    assert volume(dep, "api-keys")["secret"]["items"] == [{"key": "keys.txt", "path": "keys"}]
    assert flag(dep, "--api-keys-file") == f"{mount(dep, pod.API_KEYS_DIR)['mountPath']}/keys"
    assert flag(dep, "--scheduling-policy") == "fair"
    fcfs = build(tenants={"secretRef": {"name": "teams"}, "schedulingPolicy": "fcfs"})
    assert flag(fcfs, "--scheduling-policy") is None and flag(fcfs, "--api-keys-file") is not None
    assert volume(fcfs, "api-keys")["secret"]["items"] == [{"key": "api-keys", "path": "keys"}]
    assert flag(build(), "--scheduling-policy") is None and volume(build(), "api-keys") is None


def test_scheduling_fields() -> None:
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": []}}}
    dep = build(scheduling={"tolerations": [{"key": "dedicated", "operator": "Equal", "value": "ml",
                                             "effect": "NoSchedule"}],
                            "affinity": affinity, "priorityClassName": "high"})
    spec = dep["spec"]["template"]["spec"]
    assert {"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"} in spec["tolerations"]
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    assert spec["affinity"] == affinity
    assert spec["priorityClassName"] == "high"


def test_replicas_and_rollout() -> None:
    dep = build(replicas=3, rollout={"maxSurge": "25%", "maxUnavailable": 1})
    assert dep["spec"]["replicas"] == 3
    assert dep["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": "25%", "maxUnavailable": 1}
    assert build(autoscaling={"minReplicas": 2, "maxReplicas": 5})["spec"]["replicas"] == 2
    assert build(autoscaling={"minReplicas": 0, "maxReplicas": 5})["spec"]["replicas"] == 1
    assert build(replicas=0)["spec"]["replicas"] == 0


def test_env_is_passed_through() -> None:
    env = container(build(runtime={"env": [{"name": "LOG_LEVEL", "value": "debug"},
                                           {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]}))["env"]
    assert {"name": "LOG_LEVEL", "value": "debug"} in env
    assert {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}} in env


def test_prometheus_annotations_on_pods() -> None:
    ann = build()["spec"]["template"]["metadata"]["annotations"]
    assert ann == {"prometheus.io/scrape": "true", "prometheus.io/port": "8000", "prometheus.io/path": "/metrics"}


def test_selector_is_stable_across_spec_changes() -> None:
    a = build()
    b = build(parallelism={"tensor": 4}, runtime={"image": "other:1"}, replicas=5, model={"uri": "hf://x/y"})
    assert a["spec"]["selector"] == b["spec"]["selector"] == {"matchLabels": {"kubeinfer.dev/inferenceservice": "qwen"}}
    labels = a["spec"]["template"]["metadata"]["labels"]
    assert a["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert a["metadata"]["annotations"][builders.HASH_ANNOTATION] != b["metadata"]["annotations"][builders.HASH_ANNOTATION]


def test_hash_is_deterministic_and_tracks_content() -> None:
    assert build()["metadata"]["annotations"] == build()["metadata"]["annotations"]
    assert build(replicas=2)["metadata"]["annotations"] != build(replicas=3)["metadata"]["annotations"]


def test_every_child_is_owned_and_labelled() -> None:
    parsed = parse_spec({"model": {"uri": "hf://org/m"}})
    objs = builders.children(parsed, OWNER, CONFIG, with_service_monitor=True)
    assert [o["kind"] for o in objs] == ["Deployment", "Service", "PodDisruptionBudget", "ServiceMonitor"]
    for obj in objs:
        ref = obj["metadata"]["ownerReferences"]
        assert ref == [{"apiVersion": "kubeinfer.dev/v1alpha1", "kind": "InferenceService", "name": "qwen",
                        "uid": "0000-1111", "controller": True, "blockOwnerDeletion": True}]
        assert obj["metadata"]["namespace"] == "ml"
        assert obj["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "kubeinfer"
        assert builders.HASH_ANNOTATION in obj["metadata"]["annotations"]
    assert len(builders.children(parsed, OWNER, CONFIG, with_service_monitor=False)) == 3


def test_service_pdb_and_service_monitor_select_the_pods() -> None:
    parsed = parse_spec({"model": {"uri": "hf://org/m"}})
    pod_labels = builders.deployment(parsed, OWNER, CONFIG)["spec"]["template"]["metadata"]["labels"]
    svc = builders.service(parsed, OWNER)
    assert svc["spec"]["selector"].items() <= pod_labels.items()
    assert svc["spec"]["ports"] == [{"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"}]
    pdb = builders.pod_disruption_budget(parsed, OWNER)
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert pdb["spec"]["maxUnavailable"] == 1
    sm = builders.service_monitor(parsed, OWNER)
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert sm["spec"]["endpoints"][0]["port"] == "http" and sm["spec"]["endpoints"][0]["path"] == "/metrics"
    assert builders.endpoint(OWNER) == "http://qwen.ml.svc/v1"


@pytest.mark.parametrize("served, label", [
    (None, "qwen"),                                        # the InferenceService's name
    ("meta-llama/Llama-3.1-8B-Instruct", "meta-llama-Llama-3.1-8B-Instruct"),
    ("/" + "x" * 80, "x" * 62),                              # at most 63, alphanumeric at both ends
])
def test_pods_carry_the_labels_llm_d_selects(served, label) -> None:
    """Pods carry llm-d's model-server labels, so an InferencePool selector written for llm-d finds them."""
    import re
    model = {"uri": "hf://org/m", **({"servedName": served} if served else {})}
    labels = builders.deployment(parse_spec({"model": model}), OWNER, CONFIG)["spec"]["template"]["metadata"]["labels"]
    assert labels["llm-d.ai/inferenceServing"] == "true"
    assert labels["llm-d.ai/model"] == label
    assert re.fullmatch(r"([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9]", labels["llm-d.ai/model"])
