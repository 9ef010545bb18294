"""What the CPU's FMA units can do: fp32 FLOP/s of a loop of independent fused multiply-adds on every core.

A large GEMM (torch's 2048^3) is no peak: on the 2-vCPU AVX2 box it ran at 102-140 GFLOP/s where this loop runs at
184. The loop is compiled here, for this CPU (`cc -O2 -march=native -fopenmp`), and run on `threads` threads: 12
accumulators of the widest vector the build has (AVX-512, AVX2 or SSE), each multiplied and added once per iteration,
so nothing waits on an FMA's latency. None when no C compiler is found.

    python -P benchmarks/peers/fma_peak.py
"""
import os
import subprocess
import tempfile
from pathlib import Path

from kubeinfer.kernels import cpu_native

SOURCE = r"""
#include <immintrin.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#if defined(__AVX512F__)
typedef __m512 vec; enum { LANES = 16 };
#define SET1 _mm512_set1_ps
#define FMA _mm512_fmadd_ps
#define FIRST(v) _mm512_cvtss_f32(v)
#elif defined(__FMA__)
typedef __m256 vec; enum { LANES = 8 };
#define SET1 _mm256_set1_ps
#define FMA _mm256_fmadd_ps
#define FIRST(v) _mm256_cvtss_f32(v)
#else
typedef __m128 vec; enum { LANES = 4 };
#define SET1 _mm_set1_ps
#define FMA(a, b, c) _mm_add_ps(_mm_mul_ps(a, b), c)
#define FIRST(v) _mm_cvtss_f32(v)
#endif
int main(int argc, char **argv) {
    const long iterations = atol(argv[1]);
    const int threads = atoi(argv[2]);
    float sink = 0;
    const double started = omp_get_wtime();
#pragma omp parallel num_threads(threads) reduction(+ : sink)
    {
        vec a[12];
        const vec b = SET1(1.0000001f), c = SET1(1e-7f);
        for (int i = 0; i < 12; i++) a[i] = SET1((float)i);
        for (long k = 0; k < iterations; k++) {
#pragma GCC unroll 12
            for (int i = 0; i < 12; i++) a[i] = FMA(a[i], b, c);
        }
        for (int i = 1; i < 12; i++) a[0] = FMA(a[0], b, a[i]);
        sink += FIRST(a[0]);
    }
    const double seconds = omp_get_wtime() - started;
    printf("%.6e %g\n", (double)threads * iterations * 12 * LANES * 2 / seconds, sink);
    return 0;
}
"""


def fma_peak(threads: int | None = None, iterations: int = 50_000_000, runs: int = 3) -> float | None:
    """The best of `runs` runs' fp32 FLOP/s on `threads` threads (default: every CPU this process may use)."""
    compiler = cpu_native._compiler()
    if compiler is None:
        return None
    threads = threads or len(os.sched_getaffinity(0))
    with tempfile.TemporaryDirectory() as tmp:
        source, binary = Path(tmp) / "fma.c", Path(tmp) / "fma"
        source.write_text(SOURCE)
        subprocess.run([compiler, "-O2", "-march=native", "-fopenmp", "-o", str(binary), str(source)], check=True)
        return max(float(subprocess.run([str(binary), str(iterations), str(threads)], check=True, text=True,
                                        capture_output=True).stdout.split()[0]) for _ in range(runs))


if __name__ == "__main__":
    for count in sorted({1, len(os.sched_getaffinity(0))}):
        peak = fma_peak(count)
        print(f"{count} thread(s): " + (f"{peak / 1e9:.1f} GFLOP/s fp32" if peak else "no C compiler"))
