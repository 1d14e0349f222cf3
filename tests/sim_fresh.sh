#!/usr/bin/env bash
# Runs the simulator over a bounded budget of fresh seeds. The base seed
# changes every run (printed first); a failing seed prints its replay
# command and belongs in tests/sim_regressions.txt once fixed.
# Usage: sim_fresh.sh KVRELAY_BINARY [BUDGET_S]
set -euo pipefail
bin="${1:?usage: sim_fresh.sh KVRELAY_BINARY [BUDGET_S]}"
budget="${2:-${KVRELAY_SIM_BUDGET_S:-60}}"
base="${KVRELAY_SIM_BASE:-$(( ($(date +%s) % 100000) * 100000 + 1000000 ))}"
echo "sim_fresh: base seed $base, budget ${budget}s (set KVRELAY_SIM_BASE to replay this range)"
exec "$bin" sim --seeds "${base}..$((base + 9999999))" --budget-s "$budget" \
  --require-marks --determinism 20
