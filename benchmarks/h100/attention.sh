# Fused attention on the H100 (issue 17): the CUDA attention tests, then pxvm's FP16
# attention against PyTorch's FlashAttention (benchmarks/cuda/attention.py): the default
# kernels on every shape, then each kernel variant (head dim x keys a tile x warps) on
# issue 17's shape (2,048 tokens, 32 query heads of 128, 8 kv heads, causal) and the D 64
# one. One call carrying .gl .whl .whl_cuda (as cuda.sh).
set -o pipefail
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl .whl_cuda/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
(cd tests && timeout 240 python3 -m pytest -q -p no:cacheprovider backends/test_cuda_attention.py "$@" 2>&1 | tail -8)
timeout 120 python3 benchmarks/cuda/attention.py
for s in 128x64x4 128x64x8 128x32x4 64x128x4 64x64x4 64x64x8; do
  timeout 60 python3 benchmarks/cuda/attention.py --shape $s 2>&1 | grep -E "^\| (2048, 32/8, (128|64), causal)|kernel|Error|error"
done
