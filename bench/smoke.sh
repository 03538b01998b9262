#!/usr/bin/env bash
# Smoke run of every bench binary (crate ballast-bench): each with tiny
# parameters (a few pods, streams and requests, one round), so that a
# benchmark nothing runs cannot rot. It checks that each still runs and
# measures: every binary fails (exit status != 0, the reason on stderr) when
# a measured process did not serve (a controller never ready, a process
# that exited, no request answered, a request failed, a figure that must be
# positive read as zero). No check depends on speed: figures from debug
# builds mean nothing, and none is compared with anything.
#
# Every binary runs even when one before it failed; the script exits with
# the worst status. Each runs under `timeout` (SMOKE_TIMEOUT seconds, 600 by
# default) so that a hung one fails instead of holding CI; its processes
# are killed with it.
#
# Needs: nginx, haproxy, wrk (apt-get install nginx haproxy wrk), oha
# (cargo install --locked oha), taskset and prlimit (util-linux).
# Builds in debug: `cargo build -p ballast-bench --bins`, and
# `cargo build -p ballast -p ballast-sidecar` unless BALLAST and PROXY are
# given (SKIP_BUILD=1: nothing).
# Usage (from anywhere): [BALLAST=PATH] [PROXY=PATH] [SKIP_BUILD=1] bench/smoke.sh [NAME...]
#   NAME: run only these (index-memory tls-floor destination-bench kube-bench
#   policy-bench scale-bench fanout-floor idle-floor vcpu-stalls proxy-bench mtls-bench
#   tap-bench viz-bench).
set -euo pipefail
cd "$(dirname "$0")/.."

export PATH="$PATH:/usr/sbin:/sbin:$HOME/.cargo/bin"
# Backtraces make a failure's one line hard to find; the message says it.
export RUST_BACKTRACE=0
BIN=target/debug
SMOKE_TIMEOUT=${SMOKE_TIMEOUT:-600}

known=" index-memory tls-floor destination-bench kube-bench policy-bench scale-bench fanout-floor idle-floor vcpu-stalls proxy-bench mtls-bench tap-bench viz-bench "
for name in "$@"; do
  if [[ "$known" != *" $name "* ]]; then
    echo "bench/smoke.sh: unknown bench binary $name (known:$known)" >&2
    exit 2
  fi
done

# The bench binaries, and the measured ones unless BALLAST and PROXY name
# them (CI passes those `cargo test` built, as for bench/callgrind/run.sh).
if [ -z "${SKIP_BUILD:-}" ]; then
  if [ -z "${BALLAST:-}" ] || [ -z "${PROXY:-}" ]; then
    echo "== cargo build -p ballast -p ballast-sidecar"
    cargo build -p ballast -p ballast-sidecar
  fi
  echo "== cargo build -p ballast-bench --bins"
  cargo build -p ballast-bench --bins
fi
BALLAST=${BALLAST:-target/debug/ballast}
PROXY=${PROXY:-target/debug/ballast-proxy}

worst=0
results=()
only=("$@")
# The binary running now (its timeout's pid, which leads its process
# group): stopped with the script.
current=
stop() {
  if [ -n "$current" ]; then
    kill -TERM "$current" 2>/dev/null || true
    wait "$current" 2>/dev/null || true
  fi
  exit 130
}
trap stop INT TERM

# run NAME ARGS...: runs $BIN/NAME ARGS, records its status and time.
run() {
  local name=$1
  shift
  if [ "${#only[@]}" -gt 0 ] && [[ " ${only[*]} " != *" $name "* ]]; then
    return 0
  fi
  echo
  echo "== $name $*"
  local started=$SECONDS status=0
  # timeout runs the binary in a process group of its own and signals the
  # whole group when it expires (the binary's nginx, controllers, proxies).
  timeout --kill-after=10 "$SMOKE_TIMEOUT" "$BIN/$name" "$@" &
  current=$!
  wait "$current" || status=$?
  current=
  local took=$((SECONDS - started))
  if [ "$status" -eq 124 ] || [ "$status" -eq 137 ]; then
    echo "$name: still running after ${SMOKE_TIMEOUT} s: stopped" >&2
  fi
  if [ "$status" -ne 0 ]; then
    echo "$name: FAILED (exit status $status)" >&2
    results+=("$name: FAILED (exit status $status, ${took} s)")
  else
    results+=("$name: ok (${took} s)")
  fi
  if [ "$status" -gt "$worst" ]; then
    worst=$status
  fi
}

all_started=$SECONDS

# In process: bytes per pod, stage by stage.
run index-memory 200

# In process: what rustls holds per idle mutual TLS connection, 20 pairs.
run tls-floor 20

# The destination controller on 20 pods in 2 services; 3 Get streams on
# one service, 1 more on each service; one change per scenario.
run destination-bench --ballast "$BALLAST" --pods 20 --services 2 --streams 3 \
  --cold-streams 1 --rounds 1

# The Kubernetes source on testkit's API server: 20 pods, LIST pages of 5,
# one forced relist; then the manifests source on the same pods.
run kube-bench --ballast "$BALLAST" --pods 20 --page-size 5

# The policy API: 3 Services with 2 HTTPRoutes each, 3 Watch streams, one
# route change; then 1 s of oha (50/s) and 1 s of wrk through the proxy
# with 0, 10 and 100 routes.
run policy-bench --ballast "$BALLAST" --services 3 --routes-per-service 2 --watchers 3 \
  --rounds 1 --rate 50 --seconds 1

# One controller at a small scale: 200 pods in 40 Services, 10 HTTPRoutes;
# 500 proxies (50 on the hot Service) open 2,000 streams of the four APIs
# over 20 connections; 3 changes to the hot Service, then 3 more beside 2
# CPU hogs.
run scale-bench --ballast "$BALLAST" --pods 200 --services 40 --routes 10 --proxies 500 \
  --rounds 3 --busy 2
# The same with the bench's hand-framed HTTP/2 client (`--client raw`).
run scale-bench --ballast "$BALLAST" --pods 200 --services 40 --routes 10 --proxies 500 \
  --rounds 3 --busy 0 --client raw

# The same fan-out's floor: 500 proxies' connections written as plain
# bytes, 3 rounds per writer, then with 2 CPU hogs.
run fanout-floor --proxies 500 --rounds 3 --busy 2

# What a pause costs memory-bound work: a 4 MiB walk after 0 and 20 ms.
run idle-floor --mib 4 --hops 20000 --gaps 0,20 --repeats 1

# How long the machine stops a spinning thread: 1, then 2 spinners, 1 s each.
run vcpu-stalls --spinners 2 --seconds 1

# Every target (direct, ballast, ballast-2hop, haproxy, haproxy-2hop), one
# round: 1 s of oha at 50/s, 1 s of wrk on 2 connections, 10 idle
# connections; no waiting for a quiet machine and no retried rounds.
run proxy-bench --ballast "$BALLAST" --proxy "$PROXY" --rounds 1 --duration 1 --rates 50 \
  --connections 2 --wrk-connections 2 --idle-connections 10 --idle-settle 1 \
  --retries 0 --quiet-wait 0

# Plaintext and mutual TLS between two proxies: 1 s at 50/s, 1 s of full
# handshakes, 10 idle connections.
run mtls-bench --ballast "$BALLAST" --rounds 1 --duration 1 --rates 50 \
  --idle-connections 10 --idle-settle 1

# The five tap scenarios, 1 s at 50/s each (after the binary's 3 s warm-up).
run tap-bench --ballast "$BALLAST" --rate 50 --seconds 1 --connections 2

# viz on 20 fake proxies, a scrape every 3 s, 3 cycles per phase (the
# hanging and the 100 MB pod are retried with back-off: 3 cycles see both),
# pages up to 1 MiB; no waiting for a quiet machine.
run viz-bench --ballast "$BALLAST" --pods 20 --deployments 4 --cycles 3 --settle 0 \
  --interval 3 --max-page-mib 1 --quiet-wait 0

echo
echo "== bench binaries smoke: $((SECONDS - all_started)) s"
for r in "${results[@]}"; do
  echo "  $r"
done
exit "$worst"
