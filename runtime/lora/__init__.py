"""LoRA adapters on one base model (docs/lora.md): loading PEFT folders (`adapter`), the per-layer slots that hold
the adapters of a batch on the device (`layers`), which adapter each slot holds and which sequences use it
(`slot_table`, rank 0's scheduler), and the host-side cache that fills the slots on every rank (`weights`)."""
