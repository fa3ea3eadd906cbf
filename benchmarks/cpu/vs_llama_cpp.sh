#!/usr/bin/env bash
# The fast CPU backend against llama.cpp's CPU build, in one run on this machine:
#   bash benchmarks/cpu/vs_llama_cpp.sh [BUILD_DIR] [ROUNDS]
# BUILD_DIR (default ../llamacpp) gets llama.cpp from the llama-cpp-python source
# distribution and builds llama-bench with the CMake flags of
# ../shared/reference/anchors.md (AVX2, FMA, F16C; a native build crashed here). Then,
# ROUNDS times (default 2), llama-bench and `pxvm bench llm --backend cpu` run one after
# the other on SmolLM2-135M-Instruct Q4_1: prefill of 64 tokens and decode of 128, as
# pp64 and tg128, on the same threads. Prints each round and the ratios.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD="${1:-../llamacpp}"
ROUNDS="${2:-2}"
THREADS="${PXVM_CPU_THREADS:-$(nproc)}"
MODEL="$(python3 -c 'from pxvm.llm.gguf_model import default_model_path; print(default_model_path())')"
mkdir -p "$BUILD" artifacts
BENCH="$(ls -d "$BUILD"/llama_cpp_python-*/vendor/llama.cpp 2>/dev/null | head -1)/build/bin/llama-bench"
if [ ! -x "$BENCH" ]; then
    (cd "$BUILD" && pip download -q --no-deps --no-binary :all: llama-cpp-python -d . \
        && tar xzf llama_cpp_python-*.tar.gz)
    SRC="$(ls -d "$BUILD"/llama_cpp_python-*/vendor/llama.cpp | head -1)"
    cmake -S "$SRC" -B "$SRC/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF -DGGML_AVX2=ON \
        -DGGML_FMA=ON -DGGML_F16C=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
        -DLLAMA_BUILD_SERVER=OFF >/dev/null
    cmake --build "$SRC/build" -j"$(nproc)" --target llama-bench >/dev/null
    BENCH="$SRC/build/bin/llama-bench"
fi
echo "model: $MODEL; threads: $THREADS; $(python3 -c 'import pxvm; print(pxvm.get_backend("cpu").describe())')"
for round in $(seq "$ROUNDS"); do
    "$BENCH" -m "$MODEL" -p 64 -n 128 -t "$THREADS" -r 5 -o json > "artifacts/llama_cpu_$round.json"
    PXVM_CPU_THREADS="$THREADS" pxvm bench llm --backend cpu --prompt-tokens 64 --gen-tokens 128 \
        --repeats 5 --output "artifacts/pxvm_cpu_$round.json" > /dev/null
    python3 - "$round" <<'PY'
import json, sys
r = sys.argv[1]
llama = {("pp" if t["n_prompt"] else "tg"): t["avg_ts"]
         for t in json.load(open(f"artifacts/llama_cpu_{r}.json"))}
ours = json.load(open(f"artifacts/pxvm_cpu_{r}.json"))
pp, tg = ours["prefill_tokens_per_s"], ours["decode_tokens_per_s"]
print(f"round {r}: prefill pp64 pxvm {pp:.1f} / llama.cpp {llama['pp']:.1f} = {pp / llama['pp']:.2f}x; "
      f"decode tg128 pxvm {tg:.1f} / llama.cpp {llama['tg']:.1f} = {tg / llama['tg']:.2f}x")
PY
done
