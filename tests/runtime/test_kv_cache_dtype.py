"""Which dtype the KV cache takes for a model dtype, a device and `kv_cache_dtype`."""
import torch


def test_kv_cache_dtype_is_fp32_on_the_cpu_unless_fp8():
    from kubeinfer.runtime.engine.model_runner import FP8_DTYPE, kv_cache_dtype
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert kv_cache_dtype("auto", torch.bfloat16, cpu) == torch.float32   # the CPU kernel attends in fp32
    assert kv_cache_dtype("auto", torch.bfloat16, cuda) == torch.bfloat16
    assert kv_cache_dtype("float32", torch.bfloat16, cuda) == torch.float32
    assert kv_cache_dtype("fp8_e4m3", torch.bfloat16, cpu) == FP8_DTYPE
    assert kv_cache_dtype("bfloat16", torch.bfloat16, cpu) == torch.bfloat16   # asked for: the reference attends
