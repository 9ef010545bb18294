"""The attention kernels' test grids (tests/kernels): which cases the default run keeps."""
import pytest

# Head layouts of the attention kernels' tests: each query-group size with as few heads as shows it (the interpreter's
# time grows with the heads).
HEADS = {"mha": (4, 4), "gqa4": (8, 2), "gqa8": (8, 1), "gqa5": (10, 2)}


def attention_cases(default: set[tuple[int, int, str]], heads: dict[str, tuple[int, int]] = HEADS) -> list:
    """(num_heads, num_kv_heads, head_dim, block_size) for every layout, head size (64, 80, 128) and block size (16,
    32); those not in `default` ((block size, head size, layout) triples) run only with -m slow."""
    return [pytest.param(*heads[layout], head_dim, block_size, id=f"{block_size}-{head_dim}-{layout}",
                         marks=() if (block_size, head_dim, layout) in default else pytest.mark.slow)
            for block_size in (16, 32) for head_dim in (64, 80, 128) for layout in heads]
