#!/usr/bin/env bash
# The peer of benchmarks/llm.py: llama.cpp's llama-bench on the same GGUF files, prefill
# of 512 tokens (pp512) and decode of 128 (tg128) from contexts of the given depths.
# Usage: bash benchmarks/peers/llama_cpp.sh "0,512,4096" MODEL.gguf [MODEL.gguf ...]
# LLAMA_BIN: the folder holding llama-bench (default: gpu_machine.sh's build);
# LLAMA_ARGS: more llama-bench flags (default: every layer on the GPU, 3 repeats).
set -uo pipefail
depths=$1; shift
bin=${LLAMA_BIN:-/tmp/lcpp/llama.cpp/build/bin}
for model in "$@"; do
    "$bin/llama-bench" -m "$model" -p 512 -n 128 -d "$depths" ${LLAMA_ARGS:--ngl 99 -r 3} -o md
done
