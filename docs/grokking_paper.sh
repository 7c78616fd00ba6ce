#!/usr/bin/env bash
# The grokking paper preset: a + b mod 113, 30% of the pairs, 20,000 full-batch epochs, arms A
# and C over paired seeds (default 0 1 2; SEEDS="0 1 2 3 4 5" for more).
# Each (seed, arm) is its own run, OUT_DIR/run-SEED-ARM/grokking/results.json, and a run whose
# results.json exists is read back, not retrained: commit the finished ones and a later session
# continues with the rest. JOBS runs go at once (default: all; on a GPU a step of this small
# model is bound by kernel launches and host reads, so the runs share the device; on a CPU use
# JOBS=1 per free core). A run stopped at LIMIT seconds (default 780) keeps its checkpoint
# (every 500 epochs) in its directory and resumes from it when the script is run again. When
# every run is there, `grokking.assemble` writes them as one result, OUT_DIR/grokking.
# Usage: [DEVICE=cuda|cpu] [SEEDS="0 1 2"] [JOBS=N] bash docs/grokking_paper.sh [OUT_DIR] [LIMIT]
set -uo pipefail
out="${1:-gpu-results}"
limit="${2:-780}"
device="${DEVICE:-cuda}"
seeds="${SEEDS:-0 1 2}"
jobs_at_once="${JOBS:-0}"
mkdir -p "$out"
for seed in $seeds; do
  for arm in A C; do
    run="$out/run-$seed-$arm"
    [ -f "$run/grokking/results.json" ] && continue
    while [ "$jobs_at_once" -gt 0 ] && [ "$(jobs -rp | wc -l)" -ge "$jobs_at_once" ]; do
      wait -n
    done
    OMP_NUM_THREADS=1 timeout "$limit" rattn experiment grokking --preset paper \
      --device "$device" --seeds "$seed" --set "arms=[\"$arm\"]" --out "$run" \
      > "$run.log" 2>&1 &
  done
done
wait
python - "$out" "$device" $seeds <<'PY' > "$out/grokking_paper.txt" 2>&1
import json
import sys
from pathlib import Path

from torch_port.experiments import grokking
from torch_port.experiments.common import RunOptions

out, device, seeds = Path(sys.argv[1]), sys.argv[2], tuple(int(s) for s in sys.argv[3:])
parts = [json.loads(p.read_text()) for p in sorted(out.glob("run-*/grokking/results.json"))]
options = RunOptions(preset="paper", device=device, seeds=seeds, out=out, progress=False)
print(grokking.format_summary(grokking.assemble(options, parts)))
PY
echo "grokking paper exit $?" >> "$out/status.txt"
