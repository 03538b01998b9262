#!/usr/bin/env python3
"""A stand-in for `ballast viz` serving what a live demo never shows: an
unreachable pod, figures that are unknown (null), names and errors full of
markup, a non-mTLS edge, a call cycle, an API that fails and a collector
that stalls. It serves the dashboard's files from ASSETS_DIR with the real
server's Content-Security-Policy, and the JSON API (crates/vizcore/src/api.rs)
from fixed data.

Control (GET): /fixture/fail (every /api/* answers 503 with a JSON error),
/fixture/stale (the collector's last cycle is 10 minutes old),
/fixture/normal.

Prints `listening on http://127.0.0.1:PORT/` once it accepts connections.
"""

import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

NS = "demo"
HOSTILE_NAME = "<img src=x onerror=window.__pwned=1>"
HOSTILE_ERROR = "connect: <script>window.__pwned=1</script> refused"
HOSTILE_PATH = "/search?q=<svg onload=window.__pwned=1>"
HOSTILE_REASON = 'no_identity: "><b>not_provided_by_service_discovery'
FAIL_MESSAGE = "the collector's lock is poisoned"
INTERVAL = 2
CONTENT_TYPES = {
    "html": "text/html; charset=utf-8",
    "js": "text/javascript; charset=utf-8",
    "css": "text/css; charset=utf-8",
    "svg": "image/svg+xml",
}
MODE = {"value": "normal"}


def ref(kind, name, ns=NS):
    return {"kind": kind, "namespace": ns, "name": name}


def cycle():
    return int(time.time()) // INTERVAL * INTERVAL


def golden(rps, sr, p99):
    if rps is None:
        return {"requests": 0, "successes": 0, "rps": 0.0, "success_rate": None, "p50_ms": None, "p95_ms": None, "p99_ms": None}
    requests = int(rps * 30)
    return {"requests": requests, "successes": int(requests * sr), "rps": rps, "success_rate": sr,
            "p50_ms": p99 / 8, "p95_ms": p99 / 2, "p99_ms": p99}


def spark(rps, sr, p99):
    t = [cycle() - INTERVAL * (11 - i) for i in range(12)]
    if rps is None:
        return {"t": t, "rps": [0.0] * 12, "success_rate": [None] * 12, "p99_ms": [None] * 12}
    return {"t": t, "rps": [rps * (0.9 + 0.02 * i) for i in range(12)], "success_rate": [sr] * 11 + [None],
            "p99_ms": [p99] * 12}


# name: (kind, rps, success rate, p99, meshed, total, unreachable, source)
RESOURCES = {
    "load": ("deployment", 40.0, 1.0, 9.0, 1, 1, 0, "inbound"),
    "api": ("deployment", 30.0, 0.9, 120.0, 2, 3, 1, "inbound"),
    "db": ("deployment", 12.0, 1.0, 3.0, 1, 1, 0, "inbound"),
    "idle": ("deployment", None, None, None, 1, 1, 0, "none"),
    HOSTILE_NAME: ("deployment", 1.5, 0.5, 2000.0, 1, 1, 0, "clients"),
    "api-0": ("pod", 15.0, 1.0, 100.0, 1, 1, 0, "inbound"),
    "api-1": ("pod", 15.0, 0.8, 140.0, 1, 1, 0, "inbound"),
    "api-2": ("pod", None, None, None, 1, 1, 1, "none"),
    "web": ("service", 30.0, 0.9, 120.0, 0, 0, 0, "clients"),
}


def row(name):
    kind, rps, sr, p99, meshed, total, unreachable, source = RESOURCES[name]
    return {"resource": ref(kind, name), "meshed_pods": meshed, "total_pods": total, "unreachable_pods": unreachable,
            "source": source, "golden": golden(rps, sr, p99), "tcp_connections": 3 if source == "inbound" else None,
            "spark": spark(rps, sr, p99)}


def stat(kind):
    if kind == "namespace":
        r = row("api")
        r = dict(r, resource=ref("namespace", NS), meshed_pods=6, total_pods=7)
        return [r]
    return [row(n) for n, v in RESOURCES.items() if v[0] == kind]


def edge(src, dst, mtls, reason=""):
    return {"src": ref("deployment", src), "dst": ref("deployment", dst),
            "server_id": f"{dst}.{NS}.serviceaccount.identity.ballast.cluster.local" if mtls else None,
            "mtls": mtls, "no_tls_reason": "" if mtls else reason, "golden": golden(10.0, 1.0, 5.0)}


EDGES = [
    edge("load", "api", True),
    edge("api", "db", False, HOSTILE_REASON),
    edge("db", "api", True),
    edge("api", "api", True),
    edge("load", HOSTILE_NAME, True),
]


def pods():
    out = []
    for name, workload in [("load-1", "load"), ("api-0", "api"), ("api-1", "api"), ("api-2", "api"), ("db-0", "db")]:
        broken = name == "api-2"
        out.append({"pod": ref("pod", name), "workload": ref("deployment", workload), "addr": f"10.0.0.{len(out) + 1}:4191",
                    "state": "unreachable" if broken else "ok", "last_error": HOSTILE_ERROR if broken else None,
                    "last_scrape_at": None if broken else cycle(), "consecutive_failures": 3 if broken else 0,
                    "next_attempt_in_secs": 8 if broken else None})
    return out


def routes():
    return [{"route": ref("HTTPRoute", "api-get"), "parent": ref("service", "web"), "parent_port": 80,
             "golden": golden(20.0, 0.95, 110.0), "spark": spark(20.0, 0.95, 110.0)},
            {"route": ref("default", "default"), "parent": ref("service", "web"), "parent_port": 80,
             "golden": golden(None, None, None), "spark": spark(None, None, None)}]


def overview():
    last = cycle() - (600 if MODE["value"] == "stale" else 0)
    return {"generated_at": int(time.time()),
            "collector": {"source": "scrape", "interval_secs": INTERVAL, "history_points": 90, "pods_known": 5, "pods_ok": 4,
                          "pods_unreachable": 1, "last_cycle_ms": 3.5, "last_cycle_at": last},
            "namespaces": stat("namespace")}


def tap_event(i):
    return {"proxy": f"{NS}/load-1", "id": f"0:{i}", "direction": "outbound", "source": "10.0.0.1:50000",
            "source_identity": f"load.{NS}.serviceaccount.identity.ballast.cluster.local", "source_workload": "deployment/load",
            "destination": "10.0.0.2:8080", "destination_identity": None, "destination_workload": f"deployment/{HOSTILE_NAME}",
            "tls": False, "method": "GET", "scheme": "http", "authority": "api.demo.svc.cluster.local:80", "path": HOSTILE_PATH,
            "status": 200, "grpc_status": None, "latency_ms": 1.25, "duration_ms": 1.5, "response_bytes": 12, "error": None}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    assets = "."

    def log_message(self, *args):
        pass

    def send(self, code, content_type, body, extra=()):
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Content-Security-Policy", "default-src 'self'")
        for k, v in extra:
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def json(self, obj, code=200):
        self.send(code, "application/json", json.dumps(obj).encode() + b"\n")

    def do_GET(self):
        url = urlparse(self.path)
        q = {k: v[0] for k, v in parse_qs(url.query).items()}
        path = url.path
        if path.startswith("/fixture/"):
            MODE["value"] = path[len("/fixture/"):]
            return self.json({"mode": MODE["value"]})
        if path in ("/", "/index.html"):
            path = "/assets/index.html"
        if path in ("/assets/index.html", "/assets/app.js", "/assets/app.css", "/assets/favicon.svg"):
            with open(f"{self.assets}/{path[len('/assets/'):]}", "rb") as f:
                body = f.read()
            return self.send(200, CONTENT_TYPES[path.rsplit(".", 1)[1]], body)
        if not path.startswith("/api/"):
            return self.json({"error": f"no such page: {path}"}, 404)
        if MODE["value"] == "fail":
            return self.json({"error": FAIL_MESSAGE}, 503)
        now = int(time.time())
        ns = q.get("namespace")
        if path == "/api/overview":
            return self.json(overview())
        if path == "/api/stat":
            return self.json({"kind": q.get("kind"), "namespace": ns, "window_secs": 30, "interval_secs": INTERVAL,
                              "generated_at": now, "rows": stat(q.get("kind"))})
        if path == "/api/edges":
            return self.json({"kind": "deployment", "namespace": ns, "generated_at": now, "edges": EDGES})
        if path == "/api/pods":
            return self.json({"generated_at": now, "pods": pods()})
        if path == "/api/routes":
            return self.json({"target": q.get("target"), "namespace": ns, "generated_at": now, "rows": routes()})
        if path == "/api/workload":
            name = q.get("name", "")
            if name not in RESOURCES:
                return self.json({"error": f"deployment/{name} not found"}, 404)
            return self.json({"generated_at": now, "stat": row(name), "pods": [row(p) for p in ("api-0", "api-1", "api-2")],
                              "inbound": [e for e in EDGES if e["dst"]["name"] == name],
                              "outbound": [e for e in EDGES if e["src"]["name"] == name], "routes": routes()})
        if path == "/api/tap":
            return self.tap()
        return self.json({"error": f"no such API: {path}"}, 404)

    def tap(self):
        self.send_response(200)
        self.send_header("Content-Type", "application/x-ndjson")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

        def chunk(obj):
            data = json.dumps(obj).encode() + b"\n"
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

        try:
            chunk({"notice": f"pod {NS}/api-2: cannot tap: {HOSTILE_ERROR}"})
            for i in range(1, 10_000):
                chunk(tap_event(i))
                time.sleep(0.2)
        except (BrokenPipeError, ConnectionResetError):
            pass
        # Closing the connection ends the stream for the client.
        self.close_connection = True


def main():
    Handler.assets = sys.argv[1]
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    print(f"listening on http://127.0.0.1:{server.server_address[1]}/", flush=True)
    # Exits when the test closes stdin (or dies).
    threading.Thread(target=server.serve_forever, daemon=True).start()
    sys.stdin.read()


if __name__ == "__main__":
    main()
