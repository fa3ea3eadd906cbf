# Nsight Compute on the CUDA Q8_0 product (carry .gl .whl .whl_cuda).
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl .whl_cuda/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
echo "ncu: $NCU"
# W 4096 x 4096 and 4096 x 11008 (N x K); the third launch of each (the first repack and
# compile are done by then)
for shape in "4096 4096" "4096 11008"; do
  echo "== W $shape"
  timeout 200 $NCU --kernel-name regex:matvec --launch-skip 2 --launch-count 1 --section SpeedOfLight --section Occupancy --section MemoryWorkloadAnalysis --section LaunchStats python3 benchmarks/cuda/profile_q8_0.py $shape 2>&1 | grep -vE "^==PROF==|^\s*$" | tail -60
done
