"""A small Llama trained, here and in a few minutes of CPU, to copy a passage it has seen: the behaviour that makes
prompt lookup pay off (code edits, quoting, restating), which no random-weight model has and no real checkpoint
can bring (nothing may be downloaded).

Training data: random token passages A (24-96 tokens), each followed by a separator and A again; the loss is
on the repeat. A two-layer model learns induction heads (find the earlier occurrence of the current token,
predict what followed it), so given `A SEP A[:m]` it writes the rest of A. Saved as a Hugging Face folder
(config.json, safetensors, our byte-level tokenizer) that `kubeinfer` loads like any checkpoint; cached in
`~/.cache/kubeinfer/bench/copy-model` (delete it to retrain).

    python benchmarks/copy_model.py            # trains (or finds) the model and prints its copy accuracy
"""
import argparse
import random
import sys
import time
from pathlib import Path

import torch

VOCAB = 512
SEPARATOR = VOCAB - 1
PASSAGE_TOKENS = range(1, VOCAB - 1)   # 0 and the separator never appear inside a passage
DEFAULT_DIR = Path.home() / ".cache" / "kubeinfer" / "bench" / "copy-model"


def passage(rng: random.Random, length: int) -> list[int]:
    return [rng.choice(PASSAGE_TOKENS) for _ in range(length)]


def training_batch(rng: random.Random, batch: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of `A SEP A` (one passage length per batch, so no padding); labels only on the repeat."""
    rows = []
    for _ in range(batch):
        a = passage(rng, length)
        rows.append(a + [SEPARATOR] + a)
    ids = torch.tensor(rows)
    labels = ids.clone()
    labels[:, :length + 1] = -100
    return ids, labels


def build(path: Path, steps: int, seed: int) -> Path:
    import transformers as tf
    from kubeinfer.runtime.demo import save_tokenizer, train_tokenizer
    torch.manual_seed(seed)
    rng = random.Random(seed)
    config = tf.LlamaConfig(vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=512,
                            tie_word_embeddings=False, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    model = tf.LlamaForCausalLM(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=3e-3, total_steps=steps, pct_start=0.1)
    started = time.monotonic()
    for step in range(1, steps + 1):
        ids, labels = training_batch(rng, 32, rng.randint(24, 96))
        loss = model(input_ids=ids, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        if step % 50 == 0 or step == steps:
            print(f"\rtraining the copy model: step {step}/{steps}, loss {loss.item():.3f}, "
                  f"{time.monotonic() - started:.0f} s", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    save_tokenizer(train_tokenizer(vocab_size=VOCAB), path)
    return path


def copy_accuracy(path: Path, num_passages: int = 32, seed: int = 1) -> float:
    """Share of tokens of held-out passages that greedy decoding copies right, given `A SEP A[:4]`."""
    from kubeinfer.runtime.llm import LLM
    from kubeinfer.runtime.sampling_params import SamplingParams
    rng = random.Random(seed)
    passages = [passage(rng, rng.randint(24, 96)) for _ in range(num_passages)]
    llm = LLM(str(path))
    params = [SamplingParams(max_tokens=len(a) - 4, temperature=0, ignore_eos=True) for a in passages]
    outputs = llm.generate([a + [SEPARATOR] + a[:4] for a in passages], params)
    right = sum(x == y for a, o in zip(passages, outputs) for x, y in zip(o.token_ids, a[4:]))
    return right / sum(len(a) - 4 for a in passages)


def copy_model(path: Path = DEFAULT_DIR, steps: int = 1200, seed: int = 0) -> Path:
    """The trained model's folder, trained first if it is not there."""
    if not (path / "config.json").exists():
        build(path, steps, seed)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--path", type=Path, default=DEFAULT_DIR)
    parser.add_argument("--steps", type=int, default=1200)
    args = parser.parse_args()
    path = copy_model(args.path, args.steps)
    print(f"copy model: {path}; greedy copy accuracy on held-out passages {copy_accuracy(path):.1%}")


if __name__ == "__main__":
    main()
