"""PEFT adapters for tests: random (not zero) LoRA weights on a tiny base model, saved as PEFT saves them, and the
base model with the adapter merged in (the reference a served adapter must equal)."""
import shutil
from pathlib import Path

import torch

ALL_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def make_adapter(base_dir: Path, out_dir: Path, rank: int, seed: int, modules: list[str] = ALL_MODULES,
                 alpha: int | None = None, merged_dir: Path | None = None) -> Path:
    """Saves a PEFT LoRA adapter of `base_dir` to `out_dir` (B random, so it changes the outputs); with
    `merged_dir`, also the merged fp32 model there (weights and tokenizer)."""
    import peft
    import transformers as tf

    model = tf.AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    torch.manual_seed(seed)
    config = peft.LoraConfig(r=rank, lora_alpha=alpha or 2 * rank, target_modules=modules, lora_dropout=0.0,
                             init_lora_weights=False)
    adapted = peft.get_peft_model(model, config)
    with torch.no_grad():   # updates comparable with the tiny base weights, so tokens change but stay sane
        for name, param in adapted.named_parameters():
            if "lora_B" in name:
                param.mul_(0.5)
    adapted.save_pretrained(out_dir)
    if merged_dir is not None:
        adapted.merge_and_unload().save_pretrained(merged_dir)
        for name in ("tokenizer.json", "tokenizer_config.json"):
            if (base_dir / name).exists():
                shutil.copy(base_dir / name, merged_dir / name)
    return out_dir
