#!/usr/bin/env bash
# The GPU checks of docs/gpu.md in one script (about 10 minutes on one H100/H200-class device).
# Usage: bash docs/gpu_check.sh [OUT_DIR]   (default gpu-results); every result lands in OUT_DIR.
set -uo pipefail
out="${1:-gpu-results}"
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$out/gpu.csv"
python -c "import json, torch; print(json.dumps({'torch': torch.__version__, 'cuda': torch.version.cuda, 'device': torch.cuda.get_device_name()}))" > "$out/versions.json"
rattn compare --device cuda --dtype float64,float32,bfloat16 --full --json > "$out/compare.json"; echo "compare exit $?" >> "$out/status.txt"
rattn bench port --device cuda --dtype float32,bfloat16 --json > "$out/bench_port.json"; echo "bench port exit $?" >> "$out/status.txt"
rattn bench train --device cuda --size gpt2-small --json > "$out/bench_train.json"; echo "bench train exit $?" >> "$out/status.txt"
python docs/gpu_compile_check.py cuda > "$out/compile.json"; echo "compile check exit $?" >> "$out/status.txt"
python docs/audit_example.py && rattn audit audit-cuda-float32.npz --json > "$out/audit_float32.json" && rattn audit audit-cuda-bfloat16.npz --json > "$out/audit_bfloat16.json"; echo "audit exit $?" >> "$out/status.txt"
python -m pytest -q tests/test_torch_port.py tests/test_torch_nn.py tests/test_capturable.py tests/test_host_reads.py > "$out/pytest.txt" 2>&1; echo "pytest exit $?" >> "$out/status.txt"
