# Nsight Compute on the CUDA Q8_0 product (carry .gl .whl .whl_cuda).
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl .whl_cuda/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
echo "ncu: $NCU"
timeout 240 $NCU --kernel-name regex:matvec --launch-count 2 --section SpeedOfLight --section Occupancy --section MemoryWorkloadAnalysis python3 benchmarks/cuda/profile_q8_0.py 2>&1 | grep -vE "^==PROF==|^\s*$" | tail -70
