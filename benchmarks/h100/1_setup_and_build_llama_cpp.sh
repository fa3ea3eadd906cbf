# call A: install, stash model part 0, start the llama.cpp CUDA build in the background
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .whl_cuda/*.whl || exit 1
mkdir -p /tmp/m /tmp/lcpp && cp .model/smol.part00 /tmp/m/ && tar xzf .model/llama.cpp-src.tgz -C /tmp/lcpp
cd /tmp/lcpp/llama.cpp && setsid nohup bash -c 'cmake -B build -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_HTML=OFF > /tmp/lcpp/cmake.log 2>&1 && cmake --build build -j16 --target llama-bench > /tmp/lcpp/build.log 2>&1; echo done > /tmp/lcpp/finished' > /dev/null 2>&1 &
sleep 2; nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv; ls /tmp/m
