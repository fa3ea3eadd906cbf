# Quantized products on the H100 (issue 17). One call carrying .gl .whl .whl_cuda (as
# cuda.sh). Without arguments: the CUDA quantized tests (tests/backends/test_cuda_quantized.py,
# and the CUDA tests of the transformer's fused products and of graphs, which multiply
# through the same kernels), then benchmarks/cuda/quantized.py: each type's
# matrix-vector products against the copy, prompts (M = 512) against PyTorch, and where
# the prompt path should take over (--threshold). `variants`: every kernel shape and
# prefetch of the swept types instead (--variants, no tests).
set -o pipefail
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl .whl_cuda/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
if [ "$1" = variants ]; then
  timeout 500 python3 benchmarks/cuda/quantized.py --variants --prompt-rows 0
  exit
fi
(cd tests && timeout 240 python3 -m pytest -q -p no:cacheprovider backends/test_cuda_quantized.py \
  backends/test_cuda.py backends/test_cuda_transformer.py -k "quant or graph or fused or glu or eps" \
  2>&1 | tail -8)
timeout 280 python3 benchmarks/cuda/quantized.py --threshold
