#!/usr/bin/env bash
# The whole device check on a fresh GPU machine, in as little wall time as the compiles allow:
#
#     bash benchmarks/gpu_session.sh [OUTDIR]
#
# 1. In parallel: the CPU sweeps (tape.warmup), the batched CPU sweep and each GPU kernel over
#    every op (sweep, batch, step; float64 and float32: gpu_check's parity replays with these)
#    compile into one Numba cache, one process each;
# 2. the tests marked `gpu` (the custom-op one is left to step 3);
# 3. benchmarks/gpu_check.py --quick (custom ops, parity of every op, the compiled tier, batched throughput
#    against JAX/torch, latency, bandwidth), loading those from the cache.
# BUDGET (seconds, default 900) bounds the whole run: the check gets what is left of it.
# Logs go to OUTDIR (default: .gpu_logs), with the check's figures as gpu_check.json and
# gpu_check.md (the table benchmarks/RESULTS.md quotes). Uses the python3 on the PATH and this checkout
# (PYTHONPATH), so it runs where tape is not installed. numba-cuda 0.30.4 needs NumPy < 2.5 (a
# machine image with numpy 2.5.2 failed every kernel compile on np.row_stack): put a 2.4 wheel
# first on PYTHONPATH there.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR="${1:-.gpu_logs}"
mkdir -p "$OUT_DIR"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export NUMBA_CACHE_DIR="${NUMBA_CACHE_DIR:-$PWD/.numba_cache}"
nvidia-smi -L || true
python3 -c "import sys, numba, numpy, importlib.metadata as m; print(sys.version.split()[0], 'numba', numba.__version__, 'numba-cuda', m.version('numba-cuda'), 'numpy', numpy.__version__)"
T0=$SECONDS
python3 -c "
import time, tape
t0 = time.perf_counter()
tape.warmup()
print(f'CPU sweeps: compiled (or loaded) in {time.perf_counter() - t0:.1f} s')
" >"$OUT_DIR/warm_cpu.log" 2>&1 &
python3 -c "
import time, numpy as np, tape
from tape.batch import gradient_batch
t0 = time.perf_counter()
gradient_batch(tape.record(lambda x: (x * x).sum(), np.ones(2)), np.ones((2, 2)))
print(f'CPU batched sweep: compiled (or loaded) in {time.perf_counter() - t0:.1f} s')
" >"$OUT_DIR/warm_cpu_batch.log" 2>&1 &
for dt in float64 float32; do
for k in sweep batch step; do
    python3 -c "
import time
from tape.gpu._generated import kernels as K
from tape.gpu._ptx import signatures
t0 = time.perf_counter()
kern = getattr(K, '$k').compile(signatures('$dt')['$k'])
print(f'$k $dt: compiled (or loaded) in {time.perf_counter() - t0:.1f} s, '
      f'{kern.regs_per_thread} registers/thread')
" >"$OUT_DIR/warm_${k}_$dt.log" 2>&1 &
done
done
wait
tail -n 3 "$OUT_DIR"/warm_*.log
echo "compiles done in $((SECONDS - T0)) s"
timeout "${TEST_TIMEOUT:-90}" python3 -m pytest -q -m gpu -p no:cacheprovider \
    tests/test_cuda_sim.py -k "${TESTS:-not custom_op}" 2>&1 | tee "$OUT_DIR/pytest.log"
CHECK_TIMEOUT=$(( ${BUDGET:-900} - (SECONDS - T0) ))
echo "check gets ${CHECK_TIMEOUT} s"
timeout "$CHECK_TIMEOUT" python3 benchmarks/gpu_check.py --quick \
    --only "${SECTIONS:-custom,parity,compiled,batched,latency,bandwidth}" \
    --json "$OUT_DIR/gpu_check.json" --markdown "$OUT_DIR/gpu_check.md" 2>&1 | tee "$OUT_DIR/check.log"
echo "total $((SECONDS - T0)) s"
