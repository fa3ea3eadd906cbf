# `pxvm bench ops` on the H100 (issues 17 and 19): pxvm's kernels on CUDA and on WebGPU
# (Vulkan) against numpy and PyTorch (cuBLAS with TF32 off, SDPA) on the same GPU, every
# result checked against its numpy reference; first the command's own tests
# (tests/cli/test_bench_ops.py: its CUDA and WebGPU runs on this GPU).
#   bash benchmarks/h100/bench_ops.sh [BACKENDS] [pxvm bench ops options]
# BACKENDS: comma-separated, default cuda,webgpu; e.g. `cuda --ops matmul,matmul_quant`.
# One call carrying .gl .whl .whl_cuda; the JSON (and, where matplotlib is installed, the
# PNG) of each backend come back under $OUT.
set -o pipefail
BACKENDS=${1:-cuda,webgpu}; shift
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl .whl_cuda/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1 COLUMNS=200
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch; print('torch', torch.__version__, 'CUDA:', torch.cuda.is_available())" 2>&1 | tail -1
python3 -c "import matplotlib" 2>/dev/null || echo "no matplotlib here: JSON only"
(cd tests && timeout 150 python3 -m pytest -q -p no:cacheprovider cli/test_bench_ops.py 2>&1 | tail -5)
for backend in ${BACKENDS//,/ }; do
    echo "== pxvm bench ops --backend $backend $*"
    timeout 400 python3 -m pxvm bench ops --backend "$backend" --markdown \
        --json "$OUT/bench_ops_$backend.json" --plot "$OUT/bench_ops_$backend.png" "$@" 2>&1
    echo "exit code $?"
done
