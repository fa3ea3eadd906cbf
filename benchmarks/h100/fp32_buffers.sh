# The FP32 CUDA matmul with one and two shared-memory K slices, alternating, against
# cuBLAS (one call carrying .gl .whl .whl_cuda).
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl .whl_cuda/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
(cd tests && timeout 300 python3 -m pytest -q -p no:cacheprovider backends/test_cuda.py -k matmul 2>&1 | tail -2)
for round in 1 2; do
    for flag in "" --double; do timeout 200 python3 benchmarks/cuda/matmul.py --sizes 2048 4096 8192 $flag 2>&1 | grep -E "kernel|x 4096 x|8192 x|2048 x"; done
done
