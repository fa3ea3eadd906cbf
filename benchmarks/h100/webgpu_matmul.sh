# WebGPU (Vulkan) matrix products on the H100 (issue 19): the matmul tests on the real GPU,
# then benchmarks/webgpu/matmul.py, FP32 and FP16-storage kernels against cuBLAS FP32
# (TF32 off) and FP16 in the same run, for B as (K, N) and then as (N, K).
#   bash benchmarks/h100/webgpu_matmul.sh [benchmark options]
# e.g. `--variants` (every tile shape), `--variants --half-steps 16 32 64`,
# `--sizes 4096 --no-shapes`. One call carrying .gl .whl (torch is on the machine).
set -o pipefail
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch; print('torch', torch.__version__, 'CUDA:', torch.cuda.is_available())" 2>&1 | tail -1
(cd tests && timeout 200 python3 -m pytest -q -p no:cacheprovider ops/test_matmul.py \
    runtime/webgpu/test_params.py 2>&1 | tail -5)
timeout 250 python3 benchmarks/webgpu/matmul.py "$@"
timeout 150 python3 benchmarks/webgpu/matmul.py --transpose-b --sizes 4096 "$@"
