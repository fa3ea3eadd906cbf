for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl $(ls .whl_cuda/*.whl 2>/dev/null) >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD/src:$PWD/tests/llm PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; python3 --version
[ -f /tmp/shaped.gguf ] || python3 -c "
from make_tiny_gguf import TinySpec, write_tiny_gguf
import numpy as np, time
t=time.time()
spec = TinySpec(n_layers=30, dim=576, n_heads=9, n_kv_heads=3, ffn_dim=1536, vocab_size=49152, context_length=8192, rope_theta=100000.0)
write_tiny_gguf('/tmp/shaped.gguf', spec, np.random.default_rng(0)); print('made model', time.time()-t)"
[ "$1" = "--setup" ] && exit 0  # installed and the model written: for other scripts
# Scripts to run (default explore_decode.py), each given the model:
for script in "${@:-explore_decode.py}"; do
    echo "== $script"; python3 benchmarks/h100/$script /tmp/shaped.gguf
done
