#!/usr/bin/env bash
# Records startup.symbols, the functions link.sh places first in the sidecar's
# .text: every function the proxy runs (callgrind, names as linked) in
#   - an idle start with identity off and no controller reachable;
#   - an idle start with identity on and neither identity nor controller
#     reachable (a meshed pod during an outage);
#   - bench/callgrind/run.sh's `ballast` and `mtls` targets at a few hundred
#     requests: a start that gets its certificate and routes, then the route
#     path in plaintext and in mutual TLS, client and server side.
# Run it again when the proxy's start-up or request path changed much (the
# idle-memory gate, bench/idle/gate.sh, says when).
#
# Needs: valgrind, and what bench/callgrind/run.sh needs, and
#   cargo build -p ballast && deploy/sidecar/build.sh
# Usage (from the workspace root): deploy/sidecar/record.sh
set -euo pipefail
BALLAST=${BALLAST:-target/debug/ballast}
PROXY=${PROXY:-target/sidecar/ballast-proxy}
out=deploy/sidecar/startup.symbols
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
export VALGRIND_OPTS="--demangle=no"

idle() {
  local name=$1; shift
  timeout -s INT 10 valgrind --tool=callgrind --callgrind-out-file="$dir/callgrind.$name" \
    "$PROXY" --destination-addr 127.0.0.1:9 --outbound-addr 127.0.0.1:0 --inbound-addr 127.0.0.1:0 \
    --admin-addr 127.0.0.1:0 --tap-addr 127.0.0.1:0 --log warn "$@" >/dev/null 2>&1 || true
  [ -s "$dir/callgrind.$name" ] || { echo "record: no profile of the $name start" >&2; exit 1; }
}
idle plain --identity-disabled
"$BALLAST" identity generate --out "$dir/pki" >/dev/null 2>&1
printf tok >"$dir/token"
idle identity --identity-trust-anchors "$dir/pki/ca.crt" --identity-addr 127.0.0.1:9 \
  --identity-token-file "$dir/token" --pod-namespace bench --pod-service-account web \
  --snapshot-path "$dir/proxy.snapshot"
KEEP=$dir BALLAST=$BALLAST PROXY=$PROXY TARGETS="ballast mtls" bench/callgrind/run.sh 100 300 >/dev/null

# Function names, where first seen: `fn=` or `cfn=` (a callee), with an ID
# when compressed (`fn=(ID) NAME`, then `fn=(ID)`);
# callgrind's own entries and recursion marks (NAME'2) left out.
names() {
  cat "$@" | sed -n -E 's/^c?fn=(\([0-9]+\) )?//p' | grep -v -E '^\([0-9]+\)$|^\(below main\)|^0x' |
    sed -E "s/'[0-9]+\$//" | LC_ALL=C sort -u
}
names "$dir/callgrind.plain" "$dir/callgrind.identity" >"$dir/start"
names "$dir"/callgrind.*.* >"$dir/all"
{
  echo "# Functions the sidecar proxy runs, as linked: recorded by deploy/sidecar/record.sh,"
  echo "# placed in this order at the front of .text by deploy/sidecar/link.sh."
  echo "# Section 1: an idle start (identity off; identity on but unreachable)."
  cat "$dir/start"
  echo "# Section 2: a start that gets its certificate and routes, and the request paths."
  LC_ALL=C comm -23 "$dir/all" "$dir/start"
} >"$out"
echo "record: $(grep -c -v '^#' "$out") functions in $out ($(wc -l <"$dir/start") at start)"
