# The language model on the CUDA backend (issue 18), one call carrying .gl .whl .whl_cuda:
# the CUDA tests of its ops and of the model (against the numpy backend), then
# `pxvm bench llm --backend cuda` on a random-weight file of SmolLM2's shapes in Q8_0
# (written here: speed depends on shapes and types, not on the weights' values), from an
# empty context and with 512 tokens in it. Where SmolLM2 itself was stashed by two earlier
# calls (`mkdir -p /tmp/m && cp .model/smol.part00 /tmp/m/` carrying that part, then the
# same for part01; then this call carrying .model/smol.part02 too: README.md), also
# `pxvm generate --backend cuda` and `pxvm bench llm --backend cuda` on it. Extra
# arguments go to pytest.
set -o pipefail
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl .whl_cuda/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD/src:$PWD/tests/llm PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
(cd tests && timeout 400 python3 -m pytest -q -p no:cacheprovider -rs backends/test_cuda_transformer.py \
    llm/test_cuda_model.py "$@" 2>&1 | tail -30)

S=/tmp/shaped_q8_0.gguf
[ -f $S ] || python3 -c "
from make_tiny_gguf import TinySpec, write_tiny_gguf
import numpy as np
spec = TinySpec(n_layers=30, dim=576, n_heads=9, n_kv_heads=3, ffn_dim=1536, vocab_size=49152,
                context_length=8192, rope_theta=100000.0, matrix_type='Q8_0', embedding_type='Q8_0')
write_tiny_gguf('$S', spec, np.random.default_rng(0))"
timeout 200 python3 -m pxvm bench llm --model $S --backend cuda --repeats 5 --profile -o $OUT/llm_cuda_q8_0.json 2>&1 | tail -32
timeout 200 python3 -m pxvm bench llm --model $S --backend cuda --repeats 5 --depth 512 -o $OUT/llm_cuda_q8_0_d512.json 2>&1 | tail -3

if [ -f .model/smol.part02 ] && [ -f /tmp/m/smol.part00 ] && [ -f /tmp/m/smol.part01 ]; then
    M=/tmp/m/smol.gguf
    cat /tmp/m/smol.part00 /tmp/m/smol.part01 .model/smol.part02 > $M
    timeout 60 python3 -m pxvm generate --model $M --backend cuda --chat "What is the capital of France?" --max-tokens 32 2>&1 | tail -3
    timeout 200 python3 -m pxvm bench llm --model $M --backend cuda --repeats 5 --profile -o $OUT/llm_cuda_smollm2.json 2>&1 | tail -32
    timeout 200 python3 -m pxvm bench llm --model $M --backend cuda --repeats 5 --depth 512 -o $OUT/llm_cuda_smollm2_d512.json 2>&1 | tail -3
fi
