"""The LoRA series of `/metrics` (docs/lora.md): which adapters are loaded (the router places requests by it), and
running and waiting requests per adapter, also under vLLM's `vllm:lora_requests_info`, which gateways read."""
import time

from prometheus_client import Gauge


class LoraMetrics:
    def __init__(self, registry, model_name: str, max_loras: int, vllm_names: bool):
        labels = ["model_name", "adapter"]
        self.model_name, self.max_loras = model_name, max_loras
        self.loaded = Gauge("kubeinfer_lora_adapter_loaded", "1 for each LoRA adapter this server serves",
                            labels, registry=registry)
        self.running = Gauge("kubeinfer_lora_requests_running", "Running requests, by LoRA adapter", labels,
                             registry=registry)
        self.waiting = Gauge("kubeinfer_lora_requests_waiting", "Waiting requests, by LoRA adapter", labels,
                             registry=registry)
        self.info = Gauge("vllm:lora_requests_info", "Running and waiting LoRA adapters (vLLM name); the value is "
                          "when they last changed", ["model_name", "running_lora_adapters", "waiting_lora_adapters",
                                                     "max_lora"], registry=registry) if vllm_names else None
        self._adapters: set[str] = set()
        self._last: tuple = ()

    def set_adapters(self, names) -> None:
        """The adapters served now: series of unloaded ones are removed, new ones start at 0 requests."""
        names = set(names)
        for gone in self._adapters - names:
            for gauge in (self.loaded, self.running, self.waiting):
                gauge.remove(self.model_name, gone)
        for name in names:
            self.loaded.labels(self.model_name, name).set(1)
            self.running.labels(self.model_name, name)
            self.waiting.labels(self.model_name, name)
        self._adapters = names

    def observe(self, running: dict[str, int] | None, waiting: dict[str, int] | None) -> None:
        running, waiting = running or {}, waiting or {}
        state = (tuple(sorted(running.items())), tuple(sorted(waiting.items())))
        if state == self._last:
            return
        for name in self._adapters:
            self.running.labels(self.model_name, name).set(running.get(name, 0))
            self.waiting.labels(self.model_name, name).set(waiting.get(name, 0))
        if self.info is not None:
            self.info.clear()
            self.info.labels(self.model_name, ",".join(sorted(running)), ",".join(sorted(waiting)),
                             str(self.max_loras)).set(time.time())
        self._last = state
