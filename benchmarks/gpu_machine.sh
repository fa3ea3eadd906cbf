#!/usr/bin/env bash
# The one setup for the GPU machine (the H200 the `device` tool lends; no network there).
# Source it at the start of a call, carrying .gl .whl .whl_cuda .model (README.md says
# how they are made):
#     source benchmarks/gpu_machine.sh [smol] [1b] [8b]
# It unpacks the Vulkan loader (.gl: WebGPU needs libvulkan), installs the wheels the
# machine's image lacks into /tmp/site and exports PYTHONPATH (them, then this checkout's
# src), writes the shaped GGUF files asked for into /tmp/models (.model/shaped_gguf.py:
# random weights with the shapes and tensor types of SmolLM2-135M, Llama-3.2-1B and
# Llama-3.1-8B), and starts llama.cpp's CUDA build in a process session of its own
# (.model/llama.cpp-src.tgz; /tmp/lcpp/finished appears when it is done; it runs at the
# lowest priority on all 16 cores, so time only GPU-bound work until then).
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl .whl_cuda/*.whl || return 1 2>/dev/null || exit 1
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
mkdir -p /tmp/models /tmp/lcpp
if [ -f .model/llama.cpp-src.tgz ] && [ ! -d /tmp/lcpp/llama.cpp ]; then
    tar xzf .model/llama.cpp-src.tgz -C /tmp/lcpp
    (cd /tmp/lcpp/llama.cpp && setsid nohup nice -n 19 bash -c 'cmake -B build \
        -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
        -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_APP=OFF \
        > /tmp/lcpp/cmake.log 2>&1 && cmake --build build -j16 --target llama-bench \
        llama-batched-bench llama-server > /tmp/lcpp/build.log 2>&1; \
        touch /tmp/lcpp/finished' > /dev/null 2>&1 &)
fi
if [ $# -gt 0 ]; then
    python3 .model/shaped_gguf.py /tmp/models "$@" > /tmp/models/written.txt 2>&1 \
        || cat /tmp/models/written.txt
fi
nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv,noheader
