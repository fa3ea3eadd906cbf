for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl .whl_cuda/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
(cd tests && timeout 300 python3 -m pytest -q -p no:cacheprovider backends/test_cuda.py -k "q8_0 or quantized or repacked" 2>&1 | tail -4)
timeout 200 python3 benchmarks/cuda/bandwidth.py 2>&1 | tail -16
