# Compare another pxvm tree (OTHER: a folder holding another commit's src/ and benchmarks/,
# e.g. .ab/old from `git archive OLD src benchmarks | tar -x -C .ab/old`, carried as an
# ignored folder) with this one, in alternating processes, two rounds; each tree runs its
# own tree_ab.py. Variants (see tree_ab.py) apply to this tree only. One call, no model
# transfer (a random-weight model of SmolLM2's shapes, written by explore_decode.sh).
# Usage: [ROUNDS=2] bash benchmarks/h100/tree_ab.sh OTHER [VARIANT ..]
bash benchmarks/h100/explore_decode.sh --setup
OTHER=$(cd "$1" && pwd); shift
for round in $(seq 1 "${ROUNDS:-2}"); do
    (cd "$OTHER" && PYTHONPATH=/tmp/site:$OTHER/src:$OTHER/benchmarks/h100 timeout 250 python3 benchmarks/h100/tree_ab.py /tmp/shaped.gguf other) 2>&1 | grep -v Warning
    PYTHONPATH=/tmp/site:$PWD/src:$PWD/benchmarks/h100 timeout 250 python3 benchmarks/h100/tree_ab.py /tmp/shaped.gguf this "$@" 2>&1 | grep -v Warning
done
