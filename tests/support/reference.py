"""The reference the runtime is measured against: Hugging Face transformers on the same checkpoint."""
import torch
import transformers as tf


def hf_greedy(model_dir, prompt_ids: list[list[int]], max_tokens: int) -> list[tuple[list[int], list[torch.Tensor]]]:
    """Greedy tokens and raw per-step logprobs from transformers, one prompt at a time (no padding)."""
    model = tf.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    results = []
    for ids in prompt_ids:
        out = model.generate(torch.tensor([ids]), max_new_tokens=max_tokens, do_sample=False, eos_token_id=None,
                             pad_token_id=0, output_logits=True, return_dict_in_generate=True)
        results.append((out.sequences[0, len(ids):].tolist(),
                        [torch.log_softmax(step[0].float(), dim=-1) for step in out.logits]))
    return results
