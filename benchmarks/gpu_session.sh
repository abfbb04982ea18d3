#!/usr/bin/env bash
# The whole device check on a fresh GPU machine, in as little wall time as the compiles allow:
#
#     bash benchmarks/gpu_session.sh [OUTDIR]
#
# 1. In parallel: the CPU sweeps (tape.warmup and the batched CPU driver) and each float64 GPU
#    kernel (sweep, batch, step) compile into one Numba cache, one process each;
# 2. benchmarks/gpu_check.py --quick (parity of every op, custom ops, bandwidth, batched
#    throughput against JAX/torch, latency), loading those from the cache;
# 3. the tests marked `gpu`.
# Logs go to OUTDIR (default: .gpu_logs). Uses the python3 on the PATH and this checkout
# (PYTHONPATH), so it runs where tape is not installed.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR="${1:-.gpu_logs}"
mkdir -p "$OUT_DIR"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export NUMBA_CACHE_DIR="${NUMBA_CACHE_DIR:-$PWD/.numba_cache}"
nvidia-smi -L || true
python3 -c "import sys, numba, numpy, importlib.metadata as m; print(sys.version.split()[0], 'numba', numba.__version__, 'numba-cuda', m.version('numba-cuda'), 'numpy', numpy.__version__)"
T0=$SECONDS
python3 - >"$OUT_DIR/warm_cpu.log" 2>&1 <<'EOF' &
import time, numpy as np, tape
from tape.batch import gradient_batch
t0 = time.perf_counter()
tape.warmup()
t = tape.record(lambda x: (x * x).sum(), np.ones(2))
gradient_batch(t, np.ones((2, 2)))
print(f"CPU sweeps ready in {time.perf_counter() - t0:.1f} s")
EOF
for k in sweep batch step; do
    python3 - "$k" >"$OUT_DIR/warm_$k.log" 2>&1 <<'EOF' &
import sys, time
from tape.cuda._generated import kernels as K
from tape.cuda._ptx import signatures
k = sys.argv[1]
t0 = time.perf_counter()
kern = getattr(K, k).compile(signatures("float64")[k])
print(f"{k}: compiled (or loaded) in {time.perf_counter() - t0:.1f} s, "
      f"{kern.regs_per_thread} registers/thread")
EOF
done
wait
cat "$OUT_DIR"/warm_*.log
echo "compiles done in $((SECONDS - T0)) s"
timeout "${CHECK_TIMEOUT:-330}" python3 benchmarks/gpu_check.py --quick 2>&1 | tee "$OUT_DIR/check.log"
timeout "${TEST_TIMEOUT:-150}" python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_cuda_sim.py 2>&1 | tee "$OUT_DIR/pytest.log"
echo "total $((SECONDS - T0)) s"
