"""Pure builder of the runtime pod template (the part of the Deployment that runs the model).

Policy, decided here:
- GPUs per pod = ``resources.gpus`` (default: one per runtime process), as both request and limit of
  ``nvidia.com/gpu``. With 0 GPUs the pod requests none, the runtime runs with ``--device cpu``, and
  its KV cache gets a quarter of ``resources.memory`` (split over the runtime processes) unless
  ``runtime.kvCacheMemoryGib`` says otherwise: the rest holds the weights, activations and Python.
- Memory is requested and limited alike (a model server must not be OOM-killed by neighbours);
  CPU is only requested (limits throttle the tokenizer and HTTP loop for no gain).
- The startup probe allows ``runtime.startupTimeoutSeconds`` for loading weights; liveness only
  starts after it, so a long load is never mistaken for a hang.
- On termination the pod first sleeps in preStop (so endpoints drop it), then the runtime gets
  SIGTERM and drains for ``drainTimeoutSeconds``; the grace period covers both plus a margin.
- Root filesystem is read-only, so every writable path is an explicit emptyDir.
- Compiled kernels (Triton's cache, torch's and CUDA's) go to one volume at /var/cache/kubeinfer: an emptyDir
  unless ``runtime.compileCache`` names a node directory or a PVC that every replica shares.
- Weights: see :mod:`kubeinfer.operator.reconcile.model_cache`; security contexts:
  :mod:`kubeinfer.operator.reconcile.security`.
"""

from __future__ import annotations

import math
from typing import Any

from kubernetes.utils import parse_quantity

from kubeinfer.operator.config import OperatorConfig
from kubeinfer.operator.reconcile import model_pool
from kubeinfer.operator.reconcile.lora import fetch as lora_fetch
from kubeinfer.operator.reconcile.model_cache import MODEL_MOUNT, download_init_container, model_dir, model_volume
from kubeinfer.operator.reconcile.security import container_security_context, pod_security_context
from kubeinfer.operator.spec import InferenceServiceSpec
from kubeinfer.operator.spec.observability import tracing_env

PORT = 8000
PORT_NAME = "http"
RUNTIME_CONTAINER = "runtime"
PRESTOP_SLEEP_SECONDS = 5
GRACE_MARGIN_SECONDS = 10
# The startup probe asks every second: a replica is Ready about a second sooner than with 2 s (measured on the
# real node, CPU demo model: pod created -> Ready 4.41 -> 3.37 s, median of 3; benchmarks/pod_startup.py).
STARTUP_PERIOD_SECONDS = 1

COMPILE_CACHE_MOUNT = "/var/cache/kubeinfer"
# Where each compiler keeps its cache, under the compile cache volume.
COMPILE_CACHE_ENV = {"TRITON_CACHE_DIR": "triton", "TORCHINDUCTOR_CACHE_DIR": "torchinductor",
                     "CUDA_CACHE_PATH": "cuda", "KUBEINFER_KERNEL_CACHE_DIR": "kernels"}
API_KEYS_DIR = "/etc/kubeinfer/api-keys"
API_KEYS_FILE = f"{API_KEYS_DIR}/keys"
KV_SOURCE_KEY_FILE = "/etc/kubeinfer/kv-source-key/key"   # decode pods and the router (disaggregation)
GPU_RESOURCE = "nvidia.com/gpu"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
CPU_KV_CACHE_SHARE = 0.25


def runtime_args(spec: InferenceServiceSpec, served_name: str) -> list[str]:
    if spec.model_pool is not None:   # `kubeinfer pool`: these flags for each model's `kubeinfer serve`
        return model_pool.launcher_args(spec, served_name, PORT) + engine_args(spec)
    return ["--model", model_dir(spec.model), "--served-model-name", served_name, "--host", "0.0.0.0",
            "--port", str(PORT), *engine_args(spec)]


def engine_args(spec: InferenceServiceSpec) -> list[str]:
    rt = spec.runtime
    args = [
        "--tensor-parallel-size", str(spec.parallelism.tensor),
        *(["--expert-parallel-size", str(spec.parallelism.expert)] if spec.parallelism.expert > 1 else []),
        "--dtype", rt.dtype,
        "--block-size", str(rt.block_size),
        "--max-num-seqs", str(rt.max_num_seqs),
        "--max-num-batched-tokens", str(rt.max_num_batched_tokens),
        "--drain-timeout-seconds", str(rt.drain_timeout_seconds),
    ]
    if rt.max_model_len is not None:
        args += ["--max-model-len", str(rt.max_model_len)]
    if rt.max_waiting_requests is not None:
        args += ["--max-waiting-requests", str(rt.max_waiting_requests)]
    if rt.gpu_memory_utilization is not None:
        args += ["--gpu-memory-utilization", str(rt.gpu_memory_utilization)]
    if rt.kv_cache_dtype != "auto":
        args += ["--kv-cache-dtype", rt.kv_cache_dtype]
    if spec.scheduling_policy != "fcfs":
        args += ["--scheduling-policy", spec.scheduling_policy]
    if (spec_decode := rt.speculative) is not None:
        args += ["--speculative-method", spec_decode.method, "--speculative-tokens", str(spec_decode.num_tokens)]
        if spec_decode.method == "ngram":
            args += ["--speculative-ngram-min", str(spec_decode.ngram_min),
                     "--speculative-ngram-max", str(spec_decode.ngram_max)]
        else:
            args += ["--speculative-model", spec_decode.draft_model_path]
    if (kv_gib := kv_cache_memory_gib(spec)) is not None:
        args += ["--kv-cache-memory-gib", str(kv_gib)]
    if spec.on_cpu:
        args += ["--device", "cpu"]
        if (threads := cpu_threads(spec)) is not None:
            args += ["--cpu-threads", str(threads)]
    if not rt.enable_prefix_caching:
        args.append("--no-enable-prefix-caching")
    if spec.keys_secret_ref is not None:
        args += ["--api-keys-file", API_KEYS_FILE]
    if spec.prefix_cache_sharing != "tenant":
        args += ["--prefix-cache-sharing", spec.prefix_cache_sharing]
    if spec.trusted_tenant_header is not None:
        args += ["--trusted-tenant-header", spec.trusted_tenant_header]
    if rt.lora is not None:
        args += lora_fetch.runtime_args(rt.lora)
    return args + list(rt.extra_args)


def kv_cache_memory_gib(spec: InferenceServiceSpec) -> float | None:
    """The KV cache budget of each runtime process; None leaves the sizing to the runtime (GPU: free memory)."""
    if spec.runtime.kv_cache_memory_gib is not None:
        return spec.runtime.kv_cache_memory_gib
    if spec.on_cpu and spec.resources.memory is not None:   # a pool: shared by the models awake at once
        memory = float(parse_quantity(spec.resources.memory))
        awake = spec.model_pool.max_awake if spec.model_pool is not None else 1
        return round(memory * CPU_KV_CACHE_SHARE / spec.parallelism.processes / awake / 2**30, 3)
    return None


def cpu_threads(spec: InferenceServiceSpec) -> int | None:
    """torch threads of each runtime process of a CPU pod: the CPUs it requested (rounded up), shared by its
    processes (tensor- or expert-parallel). More threads than the pod's share of the node's cores is not free: with
    several pods on a node, each parallel op of each pod waits at its barrier for threads preempted by the
    others' (measured: two CPU replicas on 2 cores, 50 tokens/s each with 2 threads, 385 with 1)."""
    if spec.resources.cpu is None:
        return None
    cpus = float(parse_quantity(spec.resources.cpu))
    return max(1, math.ceil(cpus / spec.parallelism.processes))


def _quantity(value: int | str | None) -> str | None:
    return None if value is None else str(value)


def resources(spec: InferenceServiceSpec) -> dict[str, Any]:
    requests: dict[str, str] = {}
    limits: dict[str, str] = {}
    if not spec.on_cpu:
        requests[GPU_RESOURCE] = limits[GPU_RESOURCE] = str(spec.num_gpus)
    if (cpu := _quantity(spec.resources.cpu)) is not None:
        requests["cpu"] = cpu
    if (memory := _quantity(spec.resources.memory)) is not None:
        requests["memory"] = limits["memory"] = memory
    # Empty maps are left out: the API server drops them, and the applier would see a difference forever.
    return {key: value for key, value in (("requests", requests), ("limits", limits)) if value}


def probes(spec: InferenceServiceSpec) -> dict[str, Any]:
    startup_failures = -(-spec.runtime.startup_timeout_seconds // STARTUP_PERIOD_SECONDS)
    http = lambda path: {"httpGet": {"path": path, "port": PORT_NAME}}  # noqa: E731
    return {
        "startupProbe": {**http("/health"), "periodSeconds": STARTUP_PERIOD_SECONDS,
                         "timeoutSeconds": 5, "failureThreshold": startup_failures},
        "readinessProbe": {**http("/ready"), "periodSeconds": 5, "timeoutSeconds": 3, "failureThreshold": 3},
        "livenessProbe": {**http("/health"), "periodSeconds": 15, "timeoutSeconds": 5, "failureThreshold": 4},
    }


def termination_grace_seconds(spec: InferenceServiceSpec) -> int:
    return PRESTOP_SLEEP_SECONDS + spec.runtime.drain_timeout_seconds + GRACE_MARGIN_SECONDS


def volumes(spec: InferenceServiceSpec,
            service: str | None = None) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(pod volumes, runtime container mounts); `service`, the InferenceService's name, is needed with LoRA."""
    shm: dict[str, Any] = {"medium": "Memory"}
    if spec.resources.shm_size is not None:
        shm["sizeLimit"] = str(spec.resources.shm_size)
    vols = [{"name": "dshm", "emptyDir": shm}, {"name": "tmp", "emptyDir": {}}, compile_cache_volume(spec)]
    mounts = [{"name": "dshm", "mountPath": "/dev/shm"}, {"name": "tmp", "mountPath": "/tmp"},
              {"name": "compile-cache", "mountPath": COMPILE_CACHE_MOUNT}]
    if (model := model_volume(spec.model)) is not None:
        vols.append(model)
        mounts.append({"name": "model", "mountPath": MODEL_MOUNT, "readOnly": True})
    if (ref := spec.keys_secret_ref) is not None:
        volume, mount = secret_file("api-keys", ref.name, ref.key, API_KEYS_FILE)
        vols.append(volume)
        mounts.append(mount)
    if spec.runtime.lora is not None:
        assert service, "the adapters' ConfigMap is named after the InferenceService"
        vols += lora_fetch.volumes(spec, service)
        mounts += lora_fetch.runtime_mounts(spec)
    return vols, mounts


def secret_file(volume: str, secret: str, key: str, path: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the pod's volume, the container's mount) that show key `key` of Secret `secret` as the read-only file
    `path`: the kubelet reads the Secret, the operator never does."""
    folder, file = path.rsplit("/", 1)
    return ({"name": volume, "secret": {"secretName": secret, "items": [{"key": key, "path": file}],
                                        "defaultMode": 0o440}},
            {"name": volume, "mountPath": folder, "readOnly": True})


def compile_cache_volume(spec: InferenceServiceSpec) -> dict[str, Any]:
    cache = spec.runtime.compile_cache
    if cache.host_path:
        return {"name": "compile-cache", "hostPath": {"path": cache.host_path, "type": "DirectoryOrCreate"}}
    if cache.volume_claim:
        return {"name": "compile-cache", "persistentVolumeClaim": {"claimName": cache.volume_claim}}
    empty = {} if cache.size_limit is None else {"sizeLimit": str(cache.size_limit)}
    return {"name": "compile-cache", "emptyDir": empty}


def runtime_container(spec: InferenceServiceSpec, served_name: str, config: OperatorConfig,
                      service: str | None = None) -> dict[str, Any]:
    _, mounts = volumes(spec, service)
    env = [{"name": "HOME", "value": "/tmp"}]
    env += [{"name": name, "value": f"{COMPILE_CACHE_MOUNT}/{sub}"} for name, sub in COMPILE_CACHE_ENV.items()]
    if spec.runtime.compile_cache.weights:   # the node's weight cache (runtime/models/weight_cache.py)
        env.append({"name": "KUBEINFER_WEIGHT_CACHE_DIR", "value": f"{COMPILE_CACHE_MOUNT}/weights"})
    env += tracing_env(spec.observability, config.tracing_endpoint, service or served_name)
    env += [e.model_dump(by_alias=True, exclude_none=True) for e in spec.runtime.env]
    container: dict[str, Any] = {
        "name": RUNTIME_CONTAINER,
        "image": spec.runtime.image or config.runtime_image,
        "command": (lora_fetch.runtime_command() if spec.runtime.lora is not None
                    else ["kubeinfer", "pool" if spec.model_pool is not None else "serve"]),
        "args": runtime_args(spec, served_name),
        "ports": [{"name": PORT_NAME, "containerPort": PORT, "protocol": "TCP"}, *model_pool.ports(spec, PORT)],
        "env": env,
        "resources": resources(spec),
        **probes(spec),
        "lifecycle": {"preStop": {"exec": {"command": ["sleep", str(PRESTOP_SLEEP_SECONDS)]}}},
        # A runtime that exits on a bad setting says why in its last log line; the kubelet copies it
        # into the pod's status, and the CrashLoop condition quotes it.
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": container_security_context(),
        "volumeMounts": mounts,
    }
    if spec.runtime.image_pull_policy:
        container["imagePullPolicy"] = spec.runtime.image_pull_policy
    return container


def pod_spec(spec: InferenceServiceSpec, served_name: str, config: OperatorConfig,
             service: str | None = None) -> dict[str, Any]:
    """The replicas' pod spec; `service` (the InferenceService's name) names the adapters' ConfigMap with LoRA."""
    vols, _ = volumes(spec, service)
    node_selector = dict(spec.scheduling.node_selector)
    if spec.resources.gpu_product:
        node_selector[GPU_PRODUCT_LABEL] = spec.resources.gpu_product
    # GPU nodes are commonly tainted nvidia.com/gpu:NoSchedule; tolerate it (CPU replicas stay off them
    # unless the user tolerates it), plus the user's own.
    tolerations = [] if spec.on_cpu else [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}]
    tolerations += [t.model_dump(by_alias=True, exclude_none=True) for t in spec.scheduling.tolerations]
    pod: dict[str, Any] = {
        "containers": [runtime_container(spec, served_name, config, service)],
        "volumes": vols,
        "securityContext": pod_security_context(),
        "terminationGracePeriodSeconds": termination_grace_seconds(spec),
        # Service links would inject e.g. KUBEINFER_PORT=tcp://... for a Service named "kubeinfer",
        # which the runtime reads as its --port flag.
        "enableServiceLinks": False,
        "automountServiceAccountToken": False,
    }
    init = [c for c in (download_init_container(spec, config),) if c is not None]
    if spec.runtime.lora is not None:   # after the model's download: a native sidecar, started before the runtime
        init.append(lora_fetch.fetcher_container(spec, config))
    if init:
        pod["initContainers"] = init
    if tolerations:
        pod["tolerations"] = tolerations
    if node_selector:
        pod["nodeSelector"] = node_selector
    if spec.scheduling.affinity:
        pod["affinity"] = spec.scheduling.affinity
    if spec.scheduling.priority_class_name:
        pod["priorityClassName"] = spec.scheduling.priority_class_name
    return pod
