"""Which dtype the KV cache takes for a model dtype, a device and `kv_cache_dtype`."""
import torch


def test_kv_cache_dtype_is_the_models_except_fp16_on_the_cpu():
    from kubeinfer.runtime.engine.model_runner import FP8_DTYPE, kv_cache_dtype
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert kv_cache_dtype("auto", torch.bfloat16, cpu) == torch.bfloat16   # the CPU kernel reads a bf16 cache
    assert kv_cache_dtype("auto", torch.float16, cpu) == torch.float32     # ... but no fp16 one
    assert kv_cache_dtype("auto", torch.float32, cpu) == torch.float32
    assert kv_cache_dtype("auto", torch.bfloat16, cuda) == torch.bfloat16
    assert kv_cache_dtype("float32", torch.bfloat16, cuda) == torch.float32
    assert kv_cache_dtype("fp8_e4m3", torch.bfloat16, cpu) == FP8_DTYPE
    assert kv_cache_dtype("bfloat16", torch.bfloat16, cpu) == torch.bfloat16   # asked for: the reference attends
