#!/usr/bin/env bash
# The request path's cost, held in CI: bench/callgrind/run.sh in a short form
# (Ballast's proxy on the route path a meshed pod takes, and HAProxy, in the
# same run), failing when Ballast's instructions per request exceed the
# budget in bench/callgrind/budget: a ratio to HAProxy's, not an absolute
# figure, so a change of machine, compiler or load generator moves both.
# Instruction counts hold within a few percent on a busy machine; timings
# would not.
#
# Needs what run.sh needs, and the proxy as the image builds it:
#   deploy/sidecar/build.sh
#   cargo build -p ballast
# Usage (from the workspace root): bench/callgrind/gate.sh [SMALL] [LARGE]
set -euo pipefail
SMALL=${1:-1000}
LARGE=${2:-6000}
budget_file=bench/callgrind/budget
budget=$(awk '!/^#/ && NF { print $1; exit }' "$budget_file")
if ! awk -v b="$budget" 'BEGIN { exit !(b + 0 > 0) }'; then
  echo "gate: no ratio in $budget_file" >&2
  exit 2
fi
# The median of RUNS runs: the count of one run moves by up to about 2.5%
# with how requests batch into each wake-up under load.
RUNS=${RUNS:-3}
ratios=()
for run in $(seq 1 "$RUNS"); do
  out=$(BALLAST=${BALLAST:-target/debug/ballast} PROXY=${PROXY:-target/sidecar/ballast-proxy} \
    TARGETS="ballast haproxy" bench/callgrind/run.sh "$SMALL" "$LARGE")
  echo "run $run: $(tr '\n' ';' <<<"$out")"
  ballast=$(awk '$1 == "ballast:" { print $2 }' <<<"$out")
  haproxy=$(awk '$1 == "haproxy:" { print $2 }' <<<"$out")
  if [ -z "$ballast" ] || [ -z "$haproxy" ] || [ "$haproxy" -le 0 ]; then
    echo "gate: no figures to compare" >&2
    exit 2
  fi
  ratios+=("$(awk -v b="$ballast" -v h="$haproxy" 'BEGIN { printf "%.3f", b / h }')")
done
ratio=$(printf '%s\n' "${ratios[@]}" | sort -n | awk '{ r[NR] = $1 } END { print r[int((NR + 1) / 2)] }')
if awk -v r="$ratio" -v m="$budget" 'BEGIN { exit !(r > m) }'; then
  echo "gate: FAILED: Ballast costs ${ratio}x HAProxy's instructions per request (median of ${ratios[*]}), over the budget of ${budget}x ($budget_file)" >&2
  exit 1
fi
echo "gate: passed: ${ratio}x HAProxy's instructions per request (median of ${ratios[*]}), within the budget of ${budget}x"
