"""LoRA adapters of an InferenceService (`spec.adapters`, `spec.runtime.lora`; docs/lora.md).

    fetch.py    pure builders: where each adapter lives in a pod, the ConfigMap that lists them (its fetch
                script), the fetcher sidecar and the runtime's start command; nothing here reads spec.adapters
                into the pod template, so adding or removing an adapter never rolls the replicas
    sync.py     the I/O step: each ready replica's runtime asked what it has loaded, then told to load or unload
    status.py   pure: the step's answers as status.adapters and the AdaptersReady condition
"""
