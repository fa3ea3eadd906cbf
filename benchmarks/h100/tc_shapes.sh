for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl .whl_cuda/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
(cd tests && timeout 300 python3 -m pytest -q -p no:cacheprovider backends/test_cuda.py gpu/test_monitor.py 2>&1 | tail -4)
timeout 20 python3 -m pxvm monitor --count 1
for s in 128x32x2 128x32x3 128x64x2 128x64x3 256x64x2; do timeout 200 python3 benchmarks/cuda/matmul.py --fp16 --sizes 4096 8192 --tc-kernel mma --shape $s 2>&1 | grep -E "kernel|4096 x 4096|8192 x|11008"; done
