#!/usr/bin/env bash
# The fast CPU backend against llama.cpp's CPU build, in one run on this machine:
#   bash benchmarks/cpu/vs_llama_cpp.sh [BUILD_DIR] [ROUNDS] [MODEL.gguf ...]
# BUILD_DIR (default ../llamacpp) gets llama.cpp from the llama-cpp-python source
# distribution and builds llama-bench with the CMake flags of
# ../shared/reference/anchors.md (AVX2, FMA, F16C: no AVX-512, whatever the machine has).
# Then, ROUNDS times (default 2), for each model (default: SmolLM2-135M-Instruct Q4_1):
# llama-bench and `pxvm bench llm --backend cpu` one after the other, prefill of 64
# tokens and decode of 64 (pp64, tg64) on the same threads, first on the idle machine,
# then with a second process keeping one core busy (`python3 -c "while True: pass"`,
# running through both programs' measurements). Prints each measurement and the ratios.
# To compare AVX2 code on a machine with AVX-512, give pxvm's kernels the same target as
# llama.cpp's: NUMBA_CPU_NAME=haswell and NUMBA_CPU_FEATURES=$AVX2_FEATURES below (numba
# keeps the host's features, AVX-512 among them, where only the name is given).
set -euo pipefail
cd "$(dirname "$0")/../.."
# Haswell's: what llama.cpp's -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON build assumes
AVX2_FEATURES="+avx,+avx2,+fma,+f16c,+bmi,+bmi2,+popcnt,+sse4.2,+lzcnt,+movbe"
export AVX2_FEATURES
BUILD="${1:-../llamacpp}"
ROUNDS="${2:-2}"
shift $(( $# < 2 ? $# : 2 ))
MODELS=("$@")
[ ${#MODELS[@]} -gt 0 ] || MODELS=("$(python3 -c 'from pxvm.llm.gguf_model import default_model_path; print(default_model_path())')")
THREADS="${PXVM_CPU_THREADS:-$(nproc)}"
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
echo "threads: $THREADS; $(python3 -c 'import pxvm; print(pxvm.get_backend("cpu").describe())')"

busy_pid=""
load() {  # load on|off: one core kept busy by another process, or not
    if [ "$1" = on ]; then python3 -c "while True: pass" & busy_pid=$!; sleep 1
    elif [ -n "$busy_pid" ]; then kill "$busy_pid"; wait "$busy_pid" 2>/dev/null || true; busy_pid=""; fi
}
trap 'load off' EXIT

for round in $(seq "$ROUNDS"); do
    for model in "${MODELS[@]}"; do
        name=$(basename "$model" .gguf)
        for busy in off on; do
            tag="${name}_${round}_busy-${busy}"
            load "$busy"
            "$BENCH" -m "$model" -p 64 -n 64 -t "$THREADS" -r 3 -o json > "artifacts/llama_cpu_$tag.json"
            PXVM_CPU_THREADS="$THREADS" pxvm bench llm --backend cpu --model "$model" \
                --prompt-tokens 64 --gen-tokens 64 --repeats 3 \
                --output "artifacts/pxvm_cpu_$tag.json" > /dev/null
            load off
            python3 - "$tag" <<'PY'
import json, sys
tag = sys.argv[1]
llama = {("pp" if t["n_prompt"] else "tg"): t["avg_ts"]
         for t in json.load(open(f"artifacts/llama_cpu_{tag}.json"))}
ours = json.load(open(f"artifacts/pxvm_cpu_{tag}.json"))
pp, tg = ours["prefill_tokens_per_s"], ours["decode_tokens_per_s"]
print(f"{tag}: prefill pp64 pxvm {pp:.1f} / llama.cpp {llama['pp']:.1f} = {pp / llama['pp']:.2f}x; "
      f"decode tg64 pxvm {tg:.1f} / llama.cpp {llama['tg']:.1f} = {tg / llama['tg']:.2f}x")
PY
        done
    done
done
