#!/usr/bin/env bash
# The GPU bring-up in one command: correctness on the device, then the figures, each step bounded.
#
#   bash benchmarks/gpu_bringup.sh [LOG_DIR] [STEP ...]      steps: device tests tests-gpu tests-quick tests-attention
#                                                            kernels kernels-decode kernels-prefill moe-kernel model speculative
#                                                            startup lora structured decode-profile skinny model-skinny-off
#                                                            (default: tests kernels model startup)
#
# tests-gpu runs every test marked gpu, spread over $GPU_TEST_WORKERS pytest-xdist workers (default 8: Triton's
# compiles are CPU-bound, the GPU is shared); speculative needs the copy model (benchmarks/copy_model.py) under
# ~/.cache/kubeinfer/bench/copy-model, or trains it there (47 s on an H200); SPECULATIVE_ARGS adds arguments (e.g.
# `--model benchmarks/results/copy-model --draft`: a model trained here, carried). GPU_TESTS narrows tests-gpu to
# some files. kernels-prefill / kernels-decode: the prefill / decode attention's launch sweep alone (decode with
# the FP8 cache's).
# The runtime imports llguidance, which the CUDA image lacks: carry its wheel and put it on PYTHONPATH (kept here:
# the shim is prepended to it), e.g. pip install --no-deps --target /tmp/site .whl/*.whl; PYTHONPATH=/tmp/site.
#
# For a CUDA machine whose Python already has torch, triton, transformers, safetensors, tokenizers, numpy,
# jinja2 and pytest, where nothing can be installed: kubeinfer is put on the path through a folder of links
# (the same import names `pip install -e .` gives), so no install step is needed. Each step's full log goes
# to LOG_DIR/STEP.log and its tail is printed. PYTHON picks the interpreter (default python3).
set -uo pipefail
out=${1:-gpu-logs}
shift || true
steps=${*:-tests kernels model startup}
root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out"
shim=$(mktemp -d)
mkdir -p "$shim/kubeinfer"
cp "$root/kubeinfer/__init__.py" "$shim/kubeinfer/"
for package in operator runtime kernels; do ln -s "$root/$package" "$shim/kubeinfer/$package"; done
export PYTHONPATH=$shim${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 PYTHONSAFEPATH=1   # -P for xdist workers too: ./operator shadows the stdlib
py=${PYTHON:-python3}
cd "$root"

run_step() {  # name, time limit (s), tail lines, command...
    local name=$1 limit=$2 lines=$3
    shift 3
    local started=$SECONDS
    timeout "$limit" "$@" >"$out/$name.log" 2>&1
    local rc=$?
    echo "== $name: exit $rc in $((SECONDS - started)) s"
    tail -n "$lines" "$out/$name.log"
}

for step in $steps; do
    case $step in
    device)
        nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv >"$out/device.txt"
        "$py" -P -c 'import torch, triton, transformers; print(torch.__version__, triton.__version__,
            transformers.__version__, torch.cuda.get_device_name())' >>"$out/device.txt" 2>&1
        cat "$out/device.txt"
        ;;
    tests-gpu)
        run_step tests-gpu "${GPU_TESTS_LIMIT:-300}" 30 "$py" -P -m pytest -m gpu -q -p no:cacheprovider \
            -n "${GPU_TEST_WORKERS:-8}" ${GPU_TESTS:-tests/kernels tests/runtime/test_gpu.py tests/runtime/test_moe_models.py tests/runtime/test_lora.py}
        ;;
    moe-kernel) run_step bench-moe-kernel 150 30 "$py" -P benchmarks/moe_kernel.py ${SWEEP:+--sweep} ;;
    speculative) run_step bench-speculative "${SPECULATIVE_LIMIT:-150}" 20 "$py" -P benchmarks/speculative.py \
            --device cuda --concurrency 1 8 --trials 3 ${SPECULATIVE_ARGS:-} ;;
    tests)
        nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv >"$out/device.txt"
        "$py" -P -c 'import torch, triton, transformers; print(torch.__version__, triton.__version__,
            transformers.__version__, torch.cuda.get_device_name())' >>"$out/device.txt" 2>&1
        cat "$out/device.txt"
        run_step tests-kernels 400 12 "$py" -P -m pytest tests/kernels -m "gpu or not gpu" -q --maxfail=20 -p no:cacheprovider
        run_step tests-runtime 220 25 "$py" -P -m pytest -m "gpu or not gpu" -q -p no:cacheprovider \
            tests/runtime/test_gpu.py tests/runtime/test_models_vs_transformers.py tests/runtime/test_invariance.py \
            tests/runtime/test_block_accounting.py tests/runtime/test_stops_and_text.py tests/runtime/test_sampler.py
        ;;
    tests-quick)   # the attention kernels, the op chain and the runtime's GPU tests only
        run_step tests-quick 600 25 "$py" -P -m pytest -m "gpu or not gpu" -q -p no:cacheprovider \
            tests/runtime/test_gpu.py tests/runtime/test_models_vs_transformers.py tests/kernels/test_ops.py \
            tests/kernels/test_extend_attention.py tests/kernels/test_decode_attention.py
        ;;
    kernels) run_step bench-kernels 180 70 "$py" -P benchmarks/kernels.py ${SWEEP:+--sweep} ;;
    kernels-decode) run_step bench-kernels-decode 150 60 "$py" -P benchmarks/kernels.py --decode-only --sweep ;;
    kernels-prefill) run_step bench-kernels-prefill 150 30 "$py" -P benchmarks/kernels.py --prefill-only --sweep ;;
    model) run_step bench-model 300 60 "$py" -P benchmarks/gpu_model.py ${SKIP_HF:+--skip-transformers} ${MODEL_ARGS:-} ;;
    model-skinny-off)   # the model step with every linear layer on F.linear (the decode-size kernel off), for an A/B
        KUBEINFER_SKINNY_LINEAR=0 run_step bench-model-skinny-off 300 60 "$py" -P benchmarks/gpu_model.py \
            ${SKIP_HF:+--skip-transformers} ${MODEL_ARGS:-} ;;
    skinny) run_step bench-skinny-linear 300 80 "$py" -P benchmarks/skinny_linear.py ${SWEEP:+--sweep --rows 1 4 16} ;;
    decode-profile) run_step bench-decode-profile 180 40 "$py" -P benchmarks/decode_profile.py ;;
    tests-attention) run_step tests-attention 450 8 "$py" -P -m pytest -m "gpu or not gpu" -q -p no:cacheprovider \
            tests/kernels/test_extend_attention.py tests/kernels/test_decode_attention.py ;;
    startup) run_step bench-startup 300 15 "$py" -P benchmarks/gpu_startup.py ;;
    lora) run_step bench-lora "${LORA_LIMIT:-240}" 20 "$py" -P benchmarks/lora_throughput.py --device cuda --repeats 1 ;;
    structured) run_step bench-structured 150 10 "$py" -P benchmarks/structured_mask_cost.py --device cuda \
            --batch 256 --vocab 32000 ${TORCH_THREADS:+--torch-threads $TORCH_THREADS} ;;
    *) echo "unknown step $step (device tests tests-gpu tests-quick tests-attention kernels kernels-decode kernels-prefill moe-kernel model" \
            "speculative startup lora structured decode-profile skinny model-skinny-off)"; exit 2 ;;
    esac
done
