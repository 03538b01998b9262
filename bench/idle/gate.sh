#!/usr/bin/env bash
# The sidecar proxy's idle memory, held in CI: VmRSS 5 s after start, with
# no controller reachable, identity off and identity on (a meshed pod in an
# outage), against the budget in bench/idle/budget. The binary is read into
# the page cache first: the kernel maps the cached pages around each page of
# program text touched (fault-around), so a wholly cached binary gives the
# most. It goes up when the proxy runs
# code at start that deploy/sidecar/startup.symbols does not place first
# (then run deploy/sidecar/record.sh), or when the proxy allocates more.
#
# Needs the proxy as the image builds it (deploy/sidecar/build.sh) and
#   cargo build -p ballast   (for `ballast identity generate`)
# Usage (from the workspace root): bench/idle/gate.sh
set -euo pipefail
BALLAST=${BALLAST:-target/debug/ballast}
PROXY=${PROXY:-target/sidecar/ballast-proxy}
budget=$(awk '!/^#/ && NF { print $1; exit }' bench/idle/budget)
dir=$(mktemp -d)
pid=
cleanup() {
  if [ -n "$pid" ]; then kill "$pid" 2>/dev/null || true; fi
  rm -rf "$dir"
}
trap cleanup EXIT

# How much of the list the binary still has by its exact names.
listed=$(grep -v '^#' deploy/sidecar/startup.symbols | LC_ALL=C sort -u)
found=$(LC_ALL=C comm -12 <(echo "$listed") <(nm --defined-only "$PROXY" | awk 'NF == 3 { print $3 }' | LC_ALL=C sort -u) | wc -l)
echo "deploy/sidecar/startup.symbols: $found of $(echo "$listed" | wc -l) names found in $PROXY"

"$BALLAST" identity generate --out "$dir/pki" >/dev/null 2>&1
printf tok >"$dir/token"
# A fresh copy, read whole: how the page cache holds a file (and so how much
# fault-around maps) depends on how it was written; cp then cat is the same
# every time.
cp "$PROXY" "$dir/ballast-proxy"
cat "$dir/ballast-proxy" >/dev/null

# idle NAME FLAGS...: VmRSS in KiB, 5 s after start.
idle() {
  local name=$1 rss; shift
  "$dir/ballast-proxy" --destination-addr 127.0.0.1:9 --outbound-addr 127.0.0.1:0 --inbound-addr 127.0.0.1:0 \
    --admin-addr 127.0.0.1:0 --tap-addr 127.0.0.1:0 --log warn "$@" 2>"$dir/$name.log" &
  pid=$!
  sleep 5
  if ! kill -0 "$pid" 2>/dev/null; then
    echo "idle: the proxy ($name) exited; its log:" >&2
    tail -20 "$dir/$name.log" >&2
    exit 2
  fi
  rss=$(awk '/^VmRSS:/ { print $2 }' "/proc/$pid/status")
  echo "$name: VmRSS $rss KiB ($(grep -E '^Rss(Anon|File):' "/proc/$pid/status" | tr -s ' \t' ' ' | tr '\n' ' '))" >&2
  kill "$pid"
  wait "$pid" 2>/dev/null || true
  pid=
  echo "$rss"
}
plain=$(idle identity-off --identity-disabled)
meshed=$(idle identity-on --identity-trust-anchors "$dir/pki/ca.crt" --identity-addr 127.0.0.1:9 \
  --identity-token-file "$dir/token" --pod-namespace bench --pod-service-account web \
  --snapshot-path "$dir/proxy.snapshot")
worst=$((plain > meshed ? plain : meshed))
if [ "$worst" -gt "$budget" ]; then
  echo "idle gate: FAILED: the idle proxy holds $worst KiB, over the budget of $budget KiB (bench/idle/budget)" >&2
  exit 1
fi
echo "idle gate: passed: $plain KiB with identity off, $meshed KiB with identity on, within $budget KiB"
