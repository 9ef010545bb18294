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


def assert_same_outputs(ours, reference, top_n: int = 5, atol: float = 1e-4) -> None:
    """Same tokens; same top-N ids; logprobs within `atol` (fp32: parallelism only changes the order of the sums).
    `reference`: RequestOutputs, or (tokens, [full logprob vector per step]) pairs from `hf_greedy`."""
    for output, ref in zip(ours, reference, strict=True):
        ref_tokens = ref[0] if isinstance(ref, tuple) else ref.token_ids
        assert output.token_ids == ref_tokens
        for step, lp in enumerate(output.logprobs):
            if isinstance(ref, tuple):
                top = ref[1][step].topk(top_n)
                ref_top, ref_lp = list(zip(top.indices.tolist(), top.values.tolist())), ref[1][step][lp.token_id]
            else:
                ref_top, ref_lp = ref.logprobs[step].top, ref.logprobs[step].logprob
            assert [t for t, _ in lp.top] == [t for t, _ in ref_top]
            torch.testing.assert_close(torch.tensor([v for _, v in lp.top]), torch.tensor([v for _, v in ref_top]),
                                       atol=atol, rtol=0)
            assert abs(lp.logprob - float(ref_lp)) < atol
