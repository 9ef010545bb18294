"""xgrammar against llguidance on this CPU: compile time of a JSON schema, and the time to fill the token bitmask
of a batch of 64 sequences each step, on the demo tokenizer (512 tokens) and on a 32k-token byte-level BPE
trained here (from the Python standard library's sources, so no download). Fixed seed; prints its figures.

    python benchmarks/grammar_libraries.py [--batch 64] [--vocab 32000]
"""
import argparse
import glob
import json
import random
import statistics
import sysconfig
import time

import torch
from tokenizers import Tokenizer

from kubeinfer.runtime.demo import SPECIAL_TOKENS, train_tokenizer

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["name", "age", "tags", "role", "address"],
          "properties": {
              "name": {"type": "string", "maxLength": 24},
              "age": {"type": "integer", "minimum": 0, "maximum": 150},
              "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 4},
              "role": {"enum": ["admin", "user", "guest"]},
              "address": {"type": "object", "additionalProperties": False, "required": ["city", "zip"],
                          "properties": {"city": {"type": "string", "maxLength": 20},
                                         "zip": {"type": "string", "pattern": "^[0-9]{5}$"}}}}}


def documents(count: int, rng: random.Random) -> list[str]:
    # No escapes: xgrammar 0.2.8 refuses `\"` inside a string with maxLength (llguidance takes it).
    words = ["kube", "pod", "node", "café", "Straße", "gpu", "a b", "日本"]
    docs = []
    for _ in range(count):
        doc = {"name": " ".join(rng.sample(words, 2)), "age": rng.randint(0, 150),
               "tags": rng.sample(words, rng.randint(0, 4)), "role": rng.choice(["admin", "user", "guest"]),
               "address": {"city": rng.choice(words), "zip": f"{rng.randint(0, 99999):05d}"}}
        docs.append(json.dumps(doc, separators=(",", ":"), ensure_ascii=False))
    return docs


def big_tokenizer(vocab_size: int) -> Tokenizer:
    corpus = []
    paths = sorted(glob.glob("/usr/lib/python3*/**/*.py", recursive=True)) \
        or sorted(glob.glob(f"{sysconfig.get_paths()['stdlib']}/**/*.py", recursive=True))   # no system Python
    for path in paths[:1500]:
        with open(path, encoding="utf-8", errors="ignore") as handle:
            corpus.append(handle.read())
    return train_tokenizer(vocab_size, corpus)


class Llg:
    name = "llguidance"

    def __init__(self, tokenizer: Tokenizer, eos: int):
        import llguidance
        self.llg = llguidance
        self.tokenizer = llguidance.LLTokenizer(tokenizer.to_str(), eos_token=eos)
        self.executor = llguidance.LLExecutor()

    def compile(self, schema: dict):
        schema = dict(schema, **{"x-guidance": {"whitespace_flexible": False}})
        grammar = self.llg.LLMatcher.grammar_from_json_schema(schema)
        matcher = self.llg.LLMatcher(self.tokenizer, grammar)
        assert not matcher.is_error(), matcher.get_error()
        return grammar

    def matcher(self, grammar):
        return self.llg.LLMatcher(self.tokenizer, grammar)

    def fill(self, matchers, bitmask: torch.Tensor) -> None:
        self.executor.unsafe_compute_mask_ptr([(m, i) for i, m in enumerate(matchers)], bitmask.data_ptr(),
                                              bitmask.shape[1] * 4, bitmask.shape[0])

    def accept(self, matcher, token: int) -> None:
        assert matcher.consume_token(token), matcher.get_error()


class Xgr:
    name = "xgrammar"

    def __init__(self, tokenizer: Tokenizer, eos: int):
        import xgrammar
        from transformers import PreTrainedTokenizerFast
        self.xgr = xgrammar
        hf = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=SPECIAL_TOKENS[0])
        info = xgrammar.TokenizerInfo.from_huggingface(hf, vocab_size=tokenizer.get_vocab_size(),
                                                       stop_token_ids=[eos])
        self.compiler = xgrammar.GrammarCompiler(info, cache_enabled=False)
        self.batch = xgrammar.BatchGrammarMatcher()

    def compile(self, schema: dict):
        return self.compiler.compile_json_schema(json.dumps(schema), any_whitespace=False, separators=(",", ":"))

    def matcher(self, grammar):
        return self.xgr.GrammarMatcher(grammar)

    def fill(self, matchers, bitmask: torch.Tensor) -> None:
        self.batch.batch_fill_next_token_bitmask(matchers, bitmask)

    def accept(self, matcher, token: int) -> None:
        assert matcher.accept_token(token)


def measure(library, tokenizer: Tokenizer, batch: int, rng: random.Random) -> dict:
    vocab = tokenizer.get_vocab_size()
    compile_ms = []
    for i in range(5):   # distinct schemas: nothing cached
        schema = json.loads(json.dumps(SCHEMA).replace("maxLength\": 24", f"maxLength\": {24 + i}"))
        started = time.perf_counter()
        grammar = library.compile(schema)
        compile_ms.append((time.perf_counter() - started) * 1e3)
    docs = [tokenizer.encode(doc).ids for doc in documents(batch, rng)]
    matchers = [library.matcher(grammar) for _ in range(batch)]
    bitmask = torch.zeros(batch, (vocab + 31) // 32, dtype=torch.int32)
    fill_ms = []
    for step in range(min(map(len, docs))):
        started = time.perf_counter()
        library.fill(matchers, bitmask)
        fill_ms.append((time.perf_counter() - started) * 1e3)
        for matcher, doc in zip(matchers, docs):
            token = doc[step]
            library.accept(matcher, token)
    return {"compile_ms": statistics.median(compile_ms), "fill_ms": statistics.median(fill_ms),
            "fill_p90_ms": sorted(fill_ms)[int(0.9 * len(fill_ms))], "steps": len(fill_ms)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--vocab", type=int, default=32000)
    args = parser.parse_args()
    torch.set_num_threads(2)
    tokenizers = {"demo (512)": train_tokenizer()}
    started = time.perf_counter()
    tokenizers[f"bpe ({args.vocab})"] = big_tokenizer(args.vocab)
    print(f"trained the {args.vocab}-token tokenizer in {time.perf_counter() - started:.1f} s")
    print(f"{'library':<12}{'tokenizer':<14}{'setup s':>9}{'compile ms':>12}{'mask ms (b=' + str(args.batch) + ')':>18}"
          f"{'p90 ms':>9}")
    for tokenizer_name, tokenizer in tokenizers.items():
        eos = tokenizer.token_to_id(SPECIAL_TOKENS[0])
        for kind in (Llg, Xgr):
            started = time.perf_counter()
            library = kind(tokenizer, eos)
            setup = time.perf_counter() - started
            result = measure(library, tokenizer, args.batch, random.Random(0))
            print(f"{kind.name:<12}{tokenizer_name:<14}{setup:>9.2f}{result['compile_ms']:>12.1f}"
                  f"{result['fill_ms']:>18.3f}{result['fill_p90_ms']:>9.3f}")


if __name__ == "__main__":
    main()
