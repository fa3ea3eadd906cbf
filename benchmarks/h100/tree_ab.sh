# Compare another pxvm source tree (OTHER_SRC, e.g. an older commit's src/ carried in an
# ignored folder) with this one, in alternating processes, two rounds; variants (see
# tree_ab.py) apply to this tree only. One call, no model transfer (a random-weight model
# of SmolLM2's shapes, written by explore_decode.sh).
# Usage: bash benchmarks/h100/tree_ab.sh OTHER_SRC [VARIANT ..]
bash benchmarks/h100/explore_decode.sh --setup
OTHER=$1; shift
for round in 1 2; do
    PYTHONPATH=/tmp/site:$OTHER:$PWD/benchmarks/h100 timeout 250 python3 benchmarks/h100/tree_ab.py /tmp/shaped.gguf other 2>&1 | grep -v Warning
    PYTHONPATH=/tmp/site:$PWD/src:$PWD/benchmarks/h100 timeout 250 python3 benchmarks/h100/tree_ab.py /tmp/shaped.gguf this "$@" 2>&1 | grep -v Warning
done
