#!/usr/bin/env bash
# The grokking paper preset on one GPU: a + b mod 113, 30% of the pairs, 20,000 full-batch
# epochs, arms A and C over paired seeds (default 0 1 2; SEEDS="0 1 2 3 4 5" for more).
# Each (seed, arm) runs in its own process, all at once: a step of this small model is bound by
# kernel launches and host reads, not by the device's arithmetic, so the runs share the device.
# Then `grokking.assemble` writes them as one result, OUT_DIR/grokking/results.{json,md} and
# plots, as `rattn experiment grokking --preset paper` would. A run stopped at LIMIT seconds
# (default 780) keeps its checkpoint (every 500 epochs): run the script again with the same
# OUT_DIR and it resumes from there; finished runs are read back, not retrained.
# Usage: [SEEDS="0 1 2"] bash docs/gpu_grokking.sh [OUT_DIR] [LIMIT]
set -uo pipefail
out="${1:-gpu-results}"
limit="${2:-780}"
seeds="${SEEDS:-0 1 2}"
mkdir -p "$out"
python -c "import json, torch; print(json.dumps({'torch': torch.__version__, 'cuda': torch.version.cuda, 'device': torch.cuda.get_device_name()}))" > "$out/versions_grokking.json"
for seed in $seeds; do
  for arm in A C; do
    OMP_NUM_THREADS=1 timeout "$limit" rattn experiment grokking --preset paper --device cuda \
      --seeds "$seed" --set "arms=[\"$arm\"]" --out "$out/run-$seed-$arm" \
      > "$out/run-$seed-$arm.log" 2>&1 &
  done
done
wait
python - "$out" $seeds <<'EOF' > "$out/grokking_paper.txt" 2>&1
import json
import sys
from pathlib import Path

from torch_port.experiments import grokking
from torch_port.experiments.common import RunOptions

out, seeds = Path(sys.argv[1]), tuple(int(s) for s in sys.argv[2:])
parts = [json.loads(p.read_text()) for p in sorted(out.glob("run-*/grokking/results.json"))]
options = RunOptions(preset="paper", device="cuda", seeds=seeds, out=out, progress=False)
print(grokking.format_summary(grokking.assemble(options, parts)))
EOF
echo "grokking paper exit $?" >> "$out/status.txt"
