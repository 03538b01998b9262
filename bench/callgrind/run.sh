#!/usr/bin/env bash
# Instructions per proxied request, under callgrind: Ballast's sidecar proxy
# and HAProxy in front of the same nginx, the same load (oha, 16 keep-alive
# connections). Each proxy runs twice, with SMALL and LARGE requests; the
# difference divided by LARGE - SMALL cancels start-up and shutdown.
#
# Needs: valgrind, nginx, haproxy, oha (cargo install --locked oha), and
#   cargo build --release -p ballast -p ballast-sidecar
# Usage (from the workspace root): [KEEP=DIR] [TARGETS="ballast haproxy"] [H2=1] bench/callgrind/run.sh [SMALL] [LARGE]
#
# Targets: `ballast` (the sidecar proxy's outbound side to nginx, identity
# off), `haproxy`, and `mtls`: two Ballast proxies, A's outbound to B's
# inbound in mutual TLS (identities from a `ballast identity` the script
# starts, the HTTP/2 upgrade between them as a meshed pod has it), B in front
# of nginx; both under callgrind, each one's count and their sum reported.
set -euo pipefail
SMALL=${1:-2000}
LARGE=${2:-22000}
BALLAST=${BALLAST:-target/release/ballast}
PROXY=${PROXY:-target/release/ballast-proxy}
dir=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_ready() { for _ in $(seq 1 600); do curl -fsS -o /dev/null "$1" 2>/dev/null && return 0; sleep 0.1; done; echo "$1 never ready" >&2; return 1; }
wait_port() { for _ in $(seq 1 600); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.1; done; echo "port $1 never opened" >&2; return 1; }

backend=$(free_port)
body=$(head -c 1024 /dev/zero | tr '\0' 'x')
cat > "$dir/nginx.conf" <<NGINX
daemon off; master_process off; worker_processes 1; pid $dir/nginx.pid;
error_log stderr warn;
events { worker_connections 1024; }
http { access_log off; keepalive_requests 100000000; keepalive_timeout 3600s;
  server { listen 127.0.0.1:$backend${H2:+ http2}; location / { return 200 "$body"; } } }
NGINX
nginx -c "$dir/nginx.conf" -p "$dir" & pids+=($!)
wait_port "$backend"

mkdir -p "$dir/manifests"
grpc=$(free_port); admin=$(free_port)
# The mtls target's server proxy (B) listens here, in front of nginx.
inbound=$(free_port)
# service NAME IP PORT POD_LABELS POD_SPEC: a Service with failure accrual,
# its one pod at 127.0.0.1:PORT, and the path a meshed pod takes to it: a
# route from OutboundPolicies with retries and timeouts (NAME-route).
service() {
  cat <<YAML
apiVersion: v1
kind: Service
metadata:
  name: $1
  namespace: bench
  annotations: {balancer.linkerd.io/failure-accrual: consecutive}
spec:
  clusterIP: $2
  selector: {app: $1}
  ports: [{name: http, port: 80, targetPort: $3}]
---
apiVersion: v1
kind: Pod
metadata: {name: $1-0, namespace: bench, labels: {app: $1$4}}
spec:
$5  containers: [{name: app, ports: [{name: http, containerPort: $3}]}]
status:
  phase: Running
  podIP: 127.0.0.1
  hostIP: 127.0.0.1
  conditions: [{type: Ready, status: "True"}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata:
  name: $1-route
  namespace: bench
  annotations:
    retry.linkerd.io/http: 5xx
    retry.linkerd.io/limit: "2"
    retry.linkerd.io/timeout: 5s
spec:
  parentRefs: [{group: core, kind: Service, name: $1, port: 80}]
  rules:
  - matches: [{path: {type: PathPrefix, value: /}}]
    backendRefs: [{name: $1, port: 80}]
    timeouts: {request: 10s}
YAML
}
service backend 10.96.0.10 "$backend" "" "" >"$dir/manifests/backend.yaml"
# The mtls target's meshed pod (a service account, the control plane's
# label), whose port is proxy B's inbound.
service meshed 10.96.0.11 "$inbound" ", linkerd.io/control-plane-ns: linkerd" \
  "  serviceAccountName: server
" >"$dir/manifests/meshed.yaml"
BALLAST_LOG=warn "$BALLAST" destination --manifests "$dir/manifests" \
  --addr "127.0.0.1:$grpc" --admin-addr "127.0.0.1:$admin" & pids+=($!)
wait_port "$grpc"

# instructions PORT_TO_LOAD N COMMAND...: total Ir of COMMAND while N requests pass.
instructions() {
  local port=$1 n=$2 host=$3; shift 3
  local out="$dir/cg.$RANDOM"
  valgrind --tool=callgrind --callgrind-out-file="$out" "$@" >"$dir/proxy.log" 2>&1 &
  local vg=$!
  wait_port "$port"
  # READY_URL: an admin /ready that must answer 200 first (a certificate).
  if [ -n "${READY_URL:-}" ]; then wait_ready "$READY_URL"; fi
  if [ -n "${H2:-}" ]; then
    # An HTTP/2 client (prior knowledge), one stream at a time per
    # connection; the host is its :authority. The backend speaks HTTP/2
    # too (a proxy keeps a request's protocol to an endpoint, as Linkerd's).
    oha --no-tui -n "$n" -c 16 --http2 --connect-to "$host:80:127.0.0.1:$port" "http://$host/" >"$dir/oha.out"
  else
    oha --no-tui -n "$n" -c 16 -H "Host: $host" "http://127.0.0.1:$port/" >"$dir/oha.out"
  fi
  # CHECKED_BY names a function that says whether the path measured was
  # the one meant (for Ballast: the route with retries and timeouts).
  if [ -n "${CHECKED_BY:-}" ] && ! "$CHECKED_BY" "$n"; then
    kill -TERM "$vg" 2>/dev/null || true
    wait "$vg" 2>/dev/null || true
    tail -20 "$dir/proxy.log" >&2
    return 1
  fi
  kill -TERM "$vg" 2>/dev/null || true
  wait "$vg" 2>/dev/null || true
  # A figure only counts if the measured process served every request: a
  # proxy that exited at once would otherwise measure as a few instructions.
  local served
  served=$(awk '/\[200\]/ { print $2 }' "$dir/oha.out")
  if [ "${served:-0}" != "$n" ]; then
    echo "$(basename "$1"): served ${served:-0} of $n requests; its log:" >&2
    tail -20 "$dir/proxy.log" >&2
    sed -n '/Status code distribution/,$p' "$dir/oha.out" >&2
    return 1
  fi
  awk '/^summary:|^totals:/ { print $2; exit }' "$out"
  # KEEP=DIR keeps each profile for callgrind_annotate (as KEEP_AS, else the
  # command's name).
  if [ -n "${KEEP:-}" ]; then cp "$out" "$KEEP/callgrind.${KEEP_AS:-$(basename "$1")}.$n"; fi
}

p=$(free_port); proxy_admin=$(free_port)
# Every request went through the HTTPRoute, with a 200, on the retrying,
# timed path: its route series counts them all.
route_served() {
  local n=$1 line routes
  routes=$(curl -fsS "http://127.0.0.1:$proxy_admin/metrics" |
    grep '^outbound_http_route_request_statuses_total{' || true)
  line=$(grep "route_name=\"${ROUTE:-backend-route}\"" <<<"$routes" | grep 'http_status="200"' || true)
  if [ "${line##* }" != "$n" ]; then
    echo "ballast: expected $n requests on route ${ROUTE:-backend-route} with a 200; the proxy's route series:" >&2
    echo "${routes:-none}" >&2
    return 1
  fi
}
ballast_cmd() { local n=$1; CHECKED_BY=route_served instructions "$p" "$n" backend.bench.svc.cluster.local \
  "$PROXY" --destination-addr "127.0.0.1:$grpc" --outbound-addr "127.0.0.1:$p" \
  --inbound-addr 127.0.0.1:0 --admin-addr "127.0.0.1:$proxy_admin" --tap-addr 127.0.0.1:0 \
  --identity-disabled; }
# mtls: B (the server side) under callgrind for the whole of A's run; prints
# A's count, then B's. The identity controller is started once, here (not
# in the command substitution that runs each target).
mtls_setup() {
  "$BALLAST" identity generate --out "$dir/pki" >/dev/null 2>&1
  mkdir -p "$dir/tokens"
  for sa in client server; do
    printf 'apiVersion: v1\nkind: Secret\ntype: kubernetes.io/service-account-token\nmetadata:\n  name: %s\n  namespace: bench\n  annotations: {kubernetes.io/service-account.name: %s}\nstringData: {token: tok-%s}\n---\n' \
      "$sa" "$sa" "$sa" >>"$dir/tokens/tokens.yaml"
    printf 'tok-%s' "$sa" >"$dir/$sa.token"
  done
  identity=$(free_port)
  BALLAST_LOG=warn "$BALLAST" identity --addr "127.0.0.1:$identity" --admin-addr 127.0.0.1:0 \
    --issuer-dir "$dir/pki/issuer" --trust-anchors "$dir/pki/ca.crt" --manifests "$dir/tokens" \
    >"$dir/identity.log" 2>&1 & pids+=($!)
  wait_port "$identity"
}
case " ${TARGETS:-} " in *" mtls "*) mtls_setup ;; esac
identity_flags() {
  echo --identity-trust-anchors "$dir/pki/ca.crt" --identity-addr "127.0.0.1:$identity" \
    --identity-token-file "$dir/$1.token" --pod-namespace bench --pod-service-account "$1"
}
mtls_cmd() {
  local n=$1 out_b="$dir/cg.b.$RANDOM" b_admin a b
  b_admin=$(free_port)
  # shellcheck disable=SC2046
  valgrind --tool=callgrind --callgrind-out-file="$out_b" "$PROXY" --destination-addr 127.0.0.1:1 \
    --inbound-addr "127.0.0.1:$inbound" --inbound-forward-port "$backend" --outbound-addr 127.0.0.1:0 \
    --admin-addr "127.0.0.1:$b_admin" --tap-addr 127.0.0.1:0 $(identity_flags server) >"$dir/b.log" 2>&1 &
  local vb=$!
  wait_port "$inbound" && wait_ready "http://127.0.0.1:$b_admin/ready" || { kill "$vb"; tail -20 "$dir/b.log" >&2; return 1; }
  # shellcheck disable=SC2046
  a=$(KEEP_AS=mtls-client READY_URL="http://127.0.0.1:$proxy_admin/ready" ROUTE=meshed-route CHECKED_BY=route_served \
    instructions "$p" "$n" meshed.bench.svc.cluster.local \
    "$PROXY" --destination-addr "127.0.0.1:$grpc" --outbound-addr "127.0.0.1:$p" \
    --inbound-addr 127.0.0.1:0 --admin-addr "127.0.0.1:$proxy_admin" --tap-addr 127.0.0.1:0 \
    $(identity_flags client)) || { kill "$vb"; tail -20 "$dir/b.log" >&2; return 1; }
  # Every request reached B over mutual TLS from A's identity.
  local page
  page=$(curl -fsS "http://127.0.0.1:$b_admin/metrics" || true)
  kill -TERM "$vb" 2>/dev/null || true
  wait "$vb" 2>/dev/null || true
  if ! grep '^inbound_http_authz_allow_total{' <<<"$page" | grep 'tls="true"' | grep -q 'client_id="client\.'; then
    echo "mtls: proxy B counted no request from A's identity over TLS; its metrics:" >&2
    grep -E '^inbound_http' <<<"$page" | head -20 >&2 || true
    return 1
  fi
  b=$(awk '/^summary:|^totals:/ { print $2; exit }' "$out_b")
  if [ -n "${KEEP:-}" ]; then cp "$out_b" "$KEEP/callgrind.mtls-server.$n"; fi
  echo "$a $b"
}

h=$(free_port)
cat > "$dir/haproxy.cfg" <<HAP
global
  nbthread 1
defaults
  mode http
  timeout connect 1s
  timeout client 3600s
  timeout server 3600s
  timeout http-keep-alive 3600s
frontend fe
  bind 127.0.0.1:$h${H2:+ proto h2}
  default_backend be
backend be
  http-reuse always
  server s1 127.0.0.1:$backend${H2:+ proto h2}
HAP
haproxy_cmd() { local n=$1; instructions "$h" "$n" backend "$(command -v haproxy)" -f "$dir/haproxy.cfg"; }

for name in ${TARGETS:-ballast haproxy}; do
  small=$(${name}_cmd "$SMALL") || exit 1
  large=$(${name}_cmd "$LARGE") || exit 1
  if [ "$name" = mtls ]; then
    read -r sa sb <<<"$small"
    read -r la lb <<<"$large"
    pa=$(( (la - sa) / (LARGE - SMALL) )); pb=$(( (lb - sb) / (LARGE - SMALL) ))
    echo "mtls: $(( pa + pb )) instructions per request (client proxy $pa, server proxy $pb; $sa + $sb at $SMALL requests, $la + $lb at $LARGE)"
  else
    echo "$name: $(( (large - small) / (LARGE - SMALL) )) instructions per request ($small at $SMALL requests, $large at $LARGE)"
  fi
done
