# Hopper's wgmma tensor-core kernel on the H100 (issue 17): the graph and tensor-core
# tests, then each wgmma shape against cuBLAS FP16, and the mma.sync kernel once.
# One call carrying .gl .whl .whl_cuda (see cuda.sh).
set -o pipefail
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl .whl_cuda/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
(cd tests && timeout 240 python3 -m pytest -q -x -p no:cacheprovider backends/test_cuda.py -k "graph or hopper or tensor_core" 2>&1 | tail -5)
for s in 128x4x0 128x6x0 128x6x1 256x3x0 256x4x1; do
    timeout 100 python3 benchmarks/cuda/matmul.py --fp16 --sizes 4096 8192 --tc-kernel wgmma --shape $s 2>&1 | grep -E "kernel|4096 x 4096|8192 x|11008|rror"
done
timeout 100 python3 benchmarks/cuda/matmul.py --fp16 --sizes 4096 --tc-kernel mma 2>&1 | grep -E "4096 x 4096|rror"
