# The CUDA backend on the H100 (issue 17): its tests and the memory-bound ops' bandwidth
# against the copy and PyTorch. One call carrying .gl .whl .whl_cuda (.whl_cuda: `pip
# download --python-version 3.12 --only-binary=:all: cuda-bindings==13.0.3 nvidia-ml-py`).
set -o pipefail
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl .whl_cuda/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -m pxvm info 2>&1 | grep -B1 -A8 "CUDA"
(cd tests && timeout 300 python3 -m pytest -q -p no:cacheprovider backends/test_cuda.py gpu/test_monitor.py "$@" 2>&1 | tail -5)
timeout 20 python3 -m pxvm monitor --count 1
timeout 200 python3 benchmarks/cuda/bandwidth.py
timeout 300 python3 benchmarks/cuda/matmul.py
timeout 300 python3 benchmarks/cuda/matmul.py --fp16
