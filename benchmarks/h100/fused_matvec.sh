# The transformer's norm, residual add and GLU fused into the CUDA matrix-vector kernel
# (issue 18), one call carrying .gl .whl .whl_cuda: the CUDA tests of the kernel (every
# type, shape, prefetch and fusion), of the fused ops and of the model (against the numpy
# backend, and the launches a decoding step's layer takes), then `pxvm bench llm
# --backend cuda --profile` on random-weight files of SmolLM2's shapes (Q4_1 matrices, as
# SmolLM2-135M Q4_1; and Q8_0), fused (the code as it is) and unfused (pxvm.ops.
# transformer.matvec_takes forced false: each norm, product, add and GLU its own launch,
# as before) in alternation. Where SmolLM2 itself was stashed (llm_cuda.sh says how), on
# it too. Extra arguments go to pytest. TESTS_ONLY=1 or BENCH_ONLY=1 run one half (each
# fits one call's 10 minutes; both together may not).
set -o pipefail
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl .whl_cuda/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD/src:$PWD/tests/llm PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
if [ -z "$BENCH_ONLY" ]; then
    (cd tests && timeout 500 python3 -m pytest -q -p no:cacheprovider -rs backends/test_cuda_quantized.py \
        backends/test_cuda_transformer.py llm/test_cuda_model.py "$@" 2>&1 | tail -30)
fi
[ -n "$TESTS_ONLY" ] && exit

for type in Q4_1 Q8_0; do
    S=/tmp/shaped_$type.gguf
    [ -f $S ] || python3 -c "
from make_tiny_gguf import TinySpec, write_tiny_gguf
import numpy as np
spec = TinySpec(n_layers=30, dim=576, n_heads=9, n_kv_heads=3, ffn_dim=1536, vocab_size=49152,
                context_length=8192, rope_theta=100000.0, matrix_type='$type', embedding_type='Q8_0')
write_tiny_gguf('$S', spec, np.random.default_rng(0))"
done

bench() {  # bench FUSED(1|0) MODEL NAME: pxvm bench llm --profile, fused or not
    timeout 200 python3 -c "
import sys
import pxvm.ops.transformer as transformer
if not $1:
    transformer.matvec_takes = lambda m, k: False
from pxvm.cli import main
sys.argv[0] = 'pxvm'
main()" bench llm --model $2 --backend cuda --repeats 5 --profile -o $OUT/$3.json 2>&1 | tail -4
    python3 -c "
import json
d = json.load(open('$OUT/$3.json'))
p = d['decode_profile']
print('$3', 'decode tok/s', d['decode_tokens_per_s'], 'launches/token', p['dispatches_per_token'],
      'gpu step ms', p['gpu_step_ms'])"
}

M=/tmp/m/smol.gguf
if [ -f .model/smol.part02 ] && [ -f /tmp/m/smol.part00 ] && [ -f /tmp/m/smol.part01 ]; then
    cat /tmp/m/smol.part00 /tmp/m/smol.part01 .model/smol.part02 > $M
    timeout 60 python3 -m pxvm generate --model $M --backend cuda --chat "What is the capital of France?" --max-tokens 32 2>&1 | tail -3
fi
for round in 1 2; do
    for type in Q4_1 Q8_0; do
        [ $type = Q8_0 ] && [ $round = 2 ] && continue
        bench 1 /tmp/shaped_$type.gguf fused_${type}_$round
        bench 0 /tmp/shaped_$type.gguf unfused_${type}_$round
    done
    if [ -f $M ]; then
        bench 1 $M fused_smollm2_$round
        bench 0 $M unfused_smollm2_$round
    fi
done
