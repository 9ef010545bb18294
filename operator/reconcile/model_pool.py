"""`spec.modelPool` (operator.spec.model_pool): the replicas' `kubeinfer pool` command, the router's pool flags, and
what is awake where, for the status.

Policy, decided here:
- The InferenceService's own model is the pool's first, on the runtime's port (8000, the probes' and the Service's);
  `modelPool.models[i]` is on port 8001 + i, declared as the container's port `model-<i+1>`. Every replica runs all
  of them; the router (`--pool-model NAME=PORT` for each) wakes the one each request names, at most
  `modelPool.maxAwake` per replica.
- On CPU the KV cache share of `resources.memory` is split over the models awake at once (reconcile.pod).
- The status: reconcile.model_pool_status.
"""

from __future__ import annotations

from typing import Any

from kubeinfer.operator.reconcile.model_cache import model_dir
from kubeinfer.operator.spec import InferenceServiceSpec, ModelSource


def models(spec: InferenceServiceSpec, served_name: str, port: int) -> dict[str, int]:
    """Every model of the pool, the first one's name included, and its port."""
    assert spec.model_pool is not None
    return {served_name: port, **{m.served_name: port + 1 + i for i, m in enumerate(spec.model_pool.models)}}


def launcher_args(spec: InferenceServiceSpec, served_name: str, port: int) -> list[str]:
    """`kubeinfer pool` flags; `kubeinfer serve`'s for every model follow them."""
    pool = spec.model_pool
    assert pool is not None
    members = [f"{served_name}={model_dir(spec.model)}",
               *(f"{m.served_name}={model_dir(ModelSource(uri=m.uri))}" for m in pool.models)]
    return [*(arg for member in members for arg in ("--member", member)), "--max-awake", str(pool.max_awake),
            "--sleep-level", str(pool.sleep_level), "--host", "0.0.0.0", "--port", str(port), "--"]


def ports(spec: InferenceServiceSpec, port: int) -> list[dict[str, Any]]:
    """The container's ports of the pool's other models."""
    if spec.model_pool is None:
        return []
    return [{"name": f"model-{i}", "containerPort": port + i, "protocol": "TCP"}
            for i in range(1, len(spec.model_pool.models) + 1)]


def router_args(spec: InferenceServiceSpec, served_name: str, port: int) -> list[str]:
    pool = spec.model_pool
    assert pool is not None
    return [*(arg for name, model_port in models(spec, served_name, port).items()
              for arg in ("--pool-model", f"{name}={model_port}")),
            "--pool-max-awake", str(pool.max_awake), "--pool-sleep-level", str(pool.sleep_level)]
