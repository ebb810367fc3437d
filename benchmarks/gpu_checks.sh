#!/usr/bin/env bash
# The checks that need a CUDA GPU, in one run (what CI, which has no GPU, never runs):
#   bash benchmarks/gpu_checks.sh OUTDIR
# 1. the suite's CUDA tests (CUDA events, autocast, kernel attribution, measured roofs against
#    the datasheet, a training step's estimate against torch.cuda.max_memory_allocated);
# 2. CUDA events against torch.utils.benchmark (benchmarks/bench_latency.py);
# 3. predict's lower bound against CUDA-event-timed runs (benchmarks/bound_suite.py --device cuda);
# 4. serve's bounds against a real generate() on the GPU (benchmarks/serve_this_machine.py --device cuda);
# 5. estimate_memory against the caching allocator's peak and MemTracker (benchmarks/gpu_memory.py).
# Each part writes OUTDIR/<part>.txt; a part that fails does not stop the others.
# PARTS="tests bounds" bash benchmarks/gpu_checks.sh OUTDIR runs only those parts.
set -u
out=${1:-gpu_out}
mkdir -p "$out"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 FLOPCOUNT_NO_ROOFS_CACHE=1
py=${PYTHON:-python3}
parts=" ${PARTS:-tests bounds serve latency memory} "
wants() { [[ $parts == *" $1 "* ]]; }
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem,power.limit,memory.total --format=csv
  $py -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, torch.cuda.get_device_name(), 'SMs', torch.cuda.get_device_properties(0).multi_processor_count)"
} > "$out/env.txt" 2>&1
if wants tests; then
  timeout 240 $py -m pytest -q -rs -p no:cacheprovider -o addopts="" -k cuda \
    tests/test_memory.py tests/test_profile.py tests/test_roofline.py tests/test_devices.py \
    tests/test_measured_roofs.py tests/bench tests/tracers/test_fake.py tests/cli/test_cli.py tests/test_cuda_paths.py tests/test_cuda_readings.py > "$out/tests.txt" 2>&1
  echo "tests rc $?" >> "$out/tests.txt"
fi
if wants bounds; then
  timeout 150 $py benchmarks/bound_suite.py --device cuda --runs 7 --skip-published --json "$out/bounds.json" > "$out/bounds.txt" 2>&1
  echo "bounds rc $?" >> "$out/bounds.txt"
fi
if wants serve; then
  timeout 200 $py benchmarks/serve_this_machine.py --device cuda --runs 5 --new 8 > "$out/serve.txt" 2>&1
  echo "serve rc $?" >> "$out/serve.txt"
fi
if wants latency; then
  timeout 120 $py benchmarks/bench_latency.py --budget 0.5 --rounds 3 > "$out/latency.txt" 2>&1
  echo "latency rc $?" >> "$out/latency.txt"
fi
if wants memory; then
  timeout 200 $py benchmarks/gpu_memory.py > "$out/memory.txt" 2>&1
  echo "memory rc $?" >> "$out/memory.txt"
fi
