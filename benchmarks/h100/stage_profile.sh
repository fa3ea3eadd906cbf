# Nsight Compute on the staged Q4_K product (issue 17), one call carrying .gl .whl
# .whl_cuda: the third launch of stage_profile.py's kernel without its copies, with them,
# and the type's shape reading global memory. Reports into $OUT when set.
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl .whl_cuda/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp}
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
for mode in "nocopy stage" "copy stage" "copy none"; do
  echo "== $mode"
  report=$OUT/ncu_${mode// /_}.txt
  timeout 150 $NCU --kernel-name regex:matvec --launch-skip 2 --launch-count 1 --section SpeedOfLight \
    --section Occupancy --section WarpStateStats --section SchedulerStats --section LaunchStats \
    python3 benchmarks/h100/stage_profile.py $mode 2>&1 | grep -vE "^==PROF==|^\s*$|^    -----" > $report
  grep -E "Duration|SM Active Cycles|Elapsed Cycles|Issued Warp|No Eligible|Active Warps Per|Eligible Warps|Achieved Occupancy|Warp Cycles Per Issued|Registers Per" $report
done
