# Quantized matrix-vector products staged in shared memory (issue 17) on the H100, one
# call carrying .gl .whl .whl_cuda: the staged kernels' tests, then each swept type's
# shapes staged and not (matvec_registers.py), then benchmarks/cuda/quantized.py's
# products alone and streamed with the op's choices. Tables also into $OUT when set.
set -o pipefail
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl .whl_cuda/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
(cd tests && timeout 200 python3 -m pytest -q -p no:cacheprovider backends/test_cuda_quantized.py \
  backends/test_cuda_transformer.py backends/test_cuda.py -k "quant or graph or fused or glu or staged" \
  2>&1 | tail -4)
timeout 200 python3 benchmarks/h100/matvec_registers.py --shapes ${SHAPES:-16x4,8x8} \
  --prefetches ${PREFETCHES:-none,stage,ring} --types ${TYPES:-Q4_K,Q8_0,Q4_0,Q6_K,Q5_K} > $OUT/sweep.md
cat $OUT/sweep.md
timeout 200 python3 benchmarks/cuda/quantized.py --stream --prompt-rows 0 --types Q4_K Q8_0 Q4_0 Q6_K Q5_K \
  > $OUT/quantized.md
cat $OUT/quantized.md
