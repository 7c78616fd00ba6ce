#!/usr/bin/env bash
# The grokking paper preset on one GPU: a + b mod 113, 30% of the pairs, 20,000 full-batch
# epochs, arms A and C over 3 paired seeds (docs/results.md says what it is compared with).
# It stops at LIMIT seconds (default 780, a 15-minute device loan less its start) and is
# resumable: run it again with the same OUT_DIR and it continues from the finished runs and the
# checkpoints (every 500 epochs) it left there.
# Usage: bash docs/gpu_grokking.sh [OUT_DIR] [LIMIT]
set -uo pipefail
out="${1:-gpu-results}"
limit="${2:-780}"
mkdir -p "$out"
python -c "import json, torch; print(json.dumps({'torch': torch.__version__, 'cuda': torch.version.cuda, 'device': torch.cuda.get_device_name()}))" > "$out/versions_grokking.json"
timeout "$limit" rattn experiment grokking --preset paper --device cuda --out "$out" --json > "$out/grokking_paper.json"; echo "grokking paper exit $?" >> "$out/status.txt"
