/* paged_attention_cpu.c over a bf16 KV cache (kubeinfer_paged_attention_bf16kv): half the cache's bytes read per
   key, each row widened to fp32 as it is read; the arithmetic is the fp32 kernel's. */
#define KV_BF16 1
#include "paged_attention_cpu.c"
