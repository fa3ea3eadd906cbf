# The CUDA backend's tests alone on the H100 (one call carrying .gl .whl .whl_cuda).
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl .whl_cuda/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
cd tests && timeout 400 python3 -m pytest -q -p no:cacheprovider backends/test_cuda.py gpu/test_monitor.py "$@" 2>&1 | tail -15
