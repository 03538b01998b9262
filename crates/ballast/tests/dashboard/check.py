#!/usr/bin/env python3
"""Checks the Ballast dashboard in a real headless browser (Chromium driven
by Selenium) against a running `ballast viz` whose mesh has traffic (the
demo's: meshed client `load` calling `web` in namespace `demo`).

Every page is loaded and its figures are compared with the JSON API read at
the same scrape cycle (exactly), the client's rate with the client proxy's
own `response_total` counters (within a stated tolerance), the page is seen
to update without a reload, the workload page's Tap panel shows live
requests, and the browser's console holds no error. Screenshots of each page
go to --out (and --docs when given).

Exit 0: every check held. Exit 1: a check failed (the reason is printed).
Exit 3: no browser here (python3-selenium, chromium or chromedriver missing).
"""

import argparse
import json
import os
import re
import shutil
import sys
import time
import urllib.error
import urllib.request

# The dashboard's rps for `web` is the rate over the collector's window
# ending at its last scrape; the proxy's is over the few seconds this script
# measures. The demo's load is a steady rate, so both estimate the same
# figure; a quarter (plus 1 rps for low rates) covers the different windows
# and a busy 2-core machine.
RPS_TOLERANCE = 0.25
RPS_SLACK = 1.0
# Seconds between the two reads of the proxy's counters.
PROXY_MEASURE_SECS = 5.0
GOLDEN = ["success_rate", "rps", "p50_ms", "p95_ms", "p99_ms"]


class Failure(Exception):
    pass


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def unavailable(reason):
    print(f"UNAVAILABLE: {reason}", flush=True)
    sys.exit(3)


# ---------------------------------------------------------------- HTTP


def get(url, timeout=5.0):
    try:
        with urllib.request.urlopen(url, timeout=timeout) as res:
            return res.read()
    except (urllib.error.URLError, OSError) as e:
        raise Failure(f"GET {url}: {e}")


class Api:
    def __init__(self, base):
        self.base = base.rstrip("/")

    def __call__(self, path):
        body = get(self.base + path)
        try:
            return json.loads(body)
        except ValueError as e:
            raise Failure(f"GET {path}: not JSON: {e}")


LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def response_totals(addr, dst_deployment):
    """Sums the proxy's outbound `response_total` toward `dst_deployment`:
    (all, success)."""
    text = get(f"http://{addr}/metrics").decode("utf-8", "replace")
    total = success = 0.0
    series = 0
    for line in text.splitlines():
        if not line.startswith("response_total{"):
            continue
        head, _, value = line.rpartition("} ")
        labels = dict(LABEL.findall(head))
        if labels.get("direction") != "outbound" or labels.get("dst_deployment") != dst_deployment:
            continue
        v = float(value.split()[0])
        series += 1
        total += v
        if labels.get("classification") == "success":
            success += v
    if series == 0:
        raise Failure(
            f"the proxy at {addr} has no response_total{{direction=\"outbound\", "
            f"dst_deployment=\"{dst_deployment}\"}} series"
        )
    return total, success


# ---------------------------------------------------------------- browser

# Reads one element's figures at once (the page redraws every poll, so a
# WebElement could go stale between two reads).
READ_FIGURES = """
const el = document.querySelector(arguments[0]);
if (!el) return null;
const out = {dataset: Object.assign({}, el.dataset), fields: {}};
for (const c of el.querySelectorAll('[data-field]')) {
  out.fields[c.dataset.field] = {value: c.dataset.value, identity: c.dataset.identity, text: c.textContent.trim()};
}
return out;
"""

READ_ALL = """
return [...document.querySelectorAll(arguments[0])].map((el) => {
  const out = {dataset: Object.assign({}, el.dataset), fields: {}};
  for (const c of el.querySelectorAll('[data-field]')) {
    out.fields[c.dataset.field] = {value: c.dataset.value, identity: c.dataset.identity, text: c.textContent.trim()};
  }
  return out;
});
"""


def browser_paths():
    """Chromium and its driver (Debian's `chromium`, `chromium-driver`)."""
    chromium = os.environ.get("BALLAST_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
    driver = os.environ.get("BALLAST_CHROMEDRIVER") or shutil.which("chromedriver") or "/usr/bin/chromedriver"
    for what, path in [("chromium", chromium), ("chromedriver", driver)]:
        if not os.access(path, os.X_OK):
            unavailable(f"no {what} at {path} (apt-get install chromium chromium-driver)")
    return chromium, driver


class Browser:
    def __init__(self, base, out, docs, deadline):
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service

        chromium, driver = browser_paths()
        options = webdriver.ChromeOptions()
        options.binary_location = chromium
        for arg in [
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--window-size=1280,800",
            "--hide-scrollbars",
        ]:
            options.add_argument(arg)
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        self.driver = webdriver.Chrome(service=Service(driver), options=options)
        self.driver.set_page_load_timeout(30)
        # The page itself is 1280x800 whatever the window's frame takes.
        self.driver.execute_cdp_cmd(
            "Emulation.setDeviceMetricsOverride",
            {"width": 1280, "height": 800, "deviceScaleFactor": 1, "mobile": False},
        )
        self.base = base.rstrip("/") + "/"
        self.out = out
        self.docs = docs
        self.deadline = deadline
        self.console = []

    def quit(self):
        self.driver.quit()

    def remaining(self):
        return self.deadline - time.monotonic()

    def wait(self, what, check, timeout=60.0):
        """Waits until `check(driver)` is truthy; fails naming `what` and the
        last thing seen otherwise."""
        from selenium.common.exceptions import TimeoutException, WebDriverException
        from selenium.webdriver.support.ui import WebDriverWait

        timeout = min(timeout, self.remaining())
        if timeout <= 0:
            raise Failure(f"out of time before waiting for {what}")
        last = {"seen": None}

        def probe(driver):
            try:
                value = check(driver)
            except Failure as e:
                last["seen"] = str(e)
                return False
            except WebDriverException as e:
                last["seen"] = f"{type(e).__name__}: {e.msg}"
                return False
            last["seen"] = value
            return value

        try:
            return WebDriverWait(self.driver, timeout, poll_frequency=0.25).until(probe)
        except TimeoutException:
            raise Failure(f"timed out after {timeout:.0f} s waiting for {what}; last seen: {last['seen']!r}")

    def open(self, fragment):
        log(f"open {self.base}{fragment}")
        self.driver.get(self.base + fragment)
        self.wait(
            f"{fragment} to draw from the API",
            lambda d: d.execute_script(
                "const l = document.getElementById('live'); return l && l.dataset.state === 'ok';"
            ),
        )

    def read(self, selector):
        return self.driver.execute_script(READ_FIGURES, selector)

    def read_all(self, selector):
        return self.driver.execute_script(READ_ALL, selector)

    def updated_at(self):
        v = self.driver.execute_script(
            "return document.getElementById('last-updated').dataset.value;"
        )
        return int(v) if v else 0

    def banner(self):
        return self.driver.execute_script(
            "const b = document.getElementById('banner');"
            "return {hidden: b.hidden, kind: b.dataset.kind || '', text: b.textContent};"
        )

    def drain_console(self):
        entries = self.driver.get_log("browser")
        self.console.extend(entries)
        return entries

    def screenshot(self, name, docs=True):
        os.makedirs(self.out, exist_ok=True)
        path = os.path.join(self.out, f"{name}.png")
        self.driver.save_screenshot(path)
        if self.docs and docs:
            os.makedirs(self.docs, exist_ok=True)
            shutil.copyfile(path, os.path.join(self.docs, f"dashboard-{name}.png"))
        log(f"screenshot {path} ({os.path.getsize(path)} bytes)")


# ---------------------------------------------------------------- comparisons


def css_value(v):
    return v.replace("\\", "\\\\").replace('"', '\\"')


def row_selector(kind, namespace, name, testid="stat-row"):
    return (
        f'[data-testid="{testid}"][data-kind="{css_value(kind)}"]'
        f'[data-namespace="{css_value(namespace)}"][data-name="{css_value(name)}"]'
    )


def last_t(spark):
    t = (spark or {}).get("t") or []
    return str(t[-1]) if t else ""


def figure(page_fields, field):
    cell = page_fields.get(field)
    if cell is None:
        raise Failure(f"no {field} cell on the page")
    return cell["value"]


def same_number(page_value, api_value):
    if api_value is None:
        return page_value == ""
    if page_value == "":
        return False
    return float(page_value) == float(api_value)


def differences(page, api_row, what):
    """The figures of one stat row that differ between page and API."""
    diffs = []
    fields = page["fields"]
    for field in GOLDEN:
        got = figure(fields, field)
        want = api_row["golden"][field]
        if not same_number(got, want):
            diffs.append(f"{what} {field}: page {got!r} ({fields[field]['text']}), API {want!r}")
    meshed = f"{api_row['meshed_pods']}/{api_row['total_pods']}"
    if figure(fields, "meshed") != meshed:
        diffs.append(f"{what} meshed: page {figure(fields, 'meshed')}, API {meshed}")
    if page["dataset"].get("source") != api_row["source"]:
        diffs.append(f"{what} source: page {page['dataset'].get('source')}, API {api_row['source']}")
    if "tcp_connections" in fields and not same_number(figure(fields, "tcp_connections"), api_row["tcp_connections"]):
        diffs.append(f"{what} tcp: page {figure(fields, 'tcp_connections')}, API {api_row['tcp_connections']}")
    return diffs


def find_row(rows, kind, namespace, name):
    for r in rows:
        ref = r["resource"]
        if ref["kind"] == kind and ref["namespace"] == namespace and ref["name"] == name:
            return r
    return None


def check_stat_row(b, api, path, kind, namespace, name, what, require_traffic=True, rows_key="rows"):
    """Waits until the page shows the same scrape cycle as the API for this
    row, then requires every figure to be equal. Returns the page row."""
    selector = row_selector(kind, namespace, name)

    def matched(_):
        page = b.read(selector)
        if page is None:
            raise Failure(f"no row {selector} on the page")
        row = find_row(api(path)[rows_key], kind, namespace, name)
        if row is None:
            raise Failure(f"{path} has no row {kind}/{namespace}/{name}")
        if require_traffic and not row["golden"]["rps"]:
            raise Failure(f"{what}: no traffic yet in the API")
        if page["dataset"].get("cycle", "") != last_t(row["spark"]):
            raise Failure(f"{what}: page at cycle {page['dataset'].get('cycle')}, API at {last_t(row['spark'])}")
        return (page, row)

    page, row = b.wait(f"{what} on the page and in {path} at the same scrape cycle", matched, timeout=90)
    diffs = differences(page, row, what)
    if diffs:
        raise Failure("the page disagrees with the API at the same cycle:\n  " + "\n  ".join(diffs))
    log(
        f"{what}: page = API at cycle {page['dataset'].get('cycle')}: "
        + ", ".join(f"{f} {page['fields'][f]['text']}" for f in GOLDEN)
        + f", meshed {page['fields']['meshed']['value']}, source {row['source']}"
    )
    return page


# ---------------------------------------------------------------- the pages


def check_overview(b, api, ns):
    b.open("#/")

    def same(_):
        page = b.read('[data-testid="collector"]')
        ov = api("/api/overview")
        c = ov["collector"]
        if page is None:
            raise Failure("no collector panel")
        if str(c["last_cycle_at"]) != page["fields"]["last_cycle_at"]["value"]:
            raise Failure("page and API at different cycles")
        return (page, c)

    page, c = b.wait("the collector panel at the API's cycle", same)
    for field in ["source", "interval_secs", "pods_known", "pods_ok", "pods_unreachable"]:
        if page["fields"][field]["value"] != str(c[field]):
            raise Failure(f"collector {field}: page {page['fields'][field]['value']!r}, API {c[field]!r}")
    if c["pods_ok"] < 1:
        raise Failure(f"the collector reaches no proxy: {c}")
    log(f"overview: collector {c['source']}, every {c['interval_secs']} s, {c['pods_ok']}/{c['pods_known']} pods ok")
    # A namespace's own figures are its pods' inbound traffic, which the
    # demo's client alone does not have: equal to the API, not necessarily busy.
    check_stat_row(b, api, "/api/overview", "namespace", ns, ns, f"namespace {ns}", require_traffic=False, rows_key="namespaces")


def check_workloads(b, api, ns, server):
    b.open(f"#/deployments?namespace={ns}")
    path = f"/api/stat?kind=deployment&namespace={ns}"
    page = check_stat_row(b, api, path, "deployment", ns, server, f"deploy/{server}")
    return page


def check_live_update(b, api, ns, server):
    """Without navigating, the page's time and its figures move on."""
    b.driver.execute_script("window.__ballastNoReload = 1;")
    selector = row_selector("deployment", ns, server)
    before = b.read(selector)
    updated = b.updated_at()
    b.wait("the 'last updated' time to advance", lambda _: b.updated_at() > updated, timeout=20)
    interval = api("/api/overview")["collector"]["interval_secs"]

    def moved(_):
        now = b.read(selector)
        if now is None or now["dataset"].get("cycle") == before["dataset"].get("cycle"):
            raise Failure(f"still at cycle {before['dataset'].get('cycle')}")
        return now

    after = b.wait(f"deploy/{server} to show a new scrape cycle", moved, timeout=3 * interval + 30)
    if not b.driver.execute_script("return window.__ballastNoReload === 1;"):
        raise Failure("the page reloaded instead of updating in place")
    changed = [
        f for f in GOLDEN if before["fields"][f]["value"] != after["fields"][f]["value"]
    ]
    log(
        f"live: cycle {before['dataset'].get('cycle')} -> {after['dataset'].get('cycle')} in place; "
        f"figures that changed: {', '.join(changed) or 'none (a steady rate)'}"
    )


def check_against_proxy(b, api, ns, client, server):
    """The client proxy's own counters against the dashboard's figures."""
    pods = api(f"/api/pods?namespace={ns}")["pods"]
    mine = [p for p in pods if (p.get("workload") or {}).get("name") == client and p["state"] == "ok"]
    if not mine:
        raise Failure(f"no scraped pod of deploy/{client} in /api/pods: {pods}")
    addr = mine[0]["addr"]
    t1 = time.monotonic()
    total1, ok1 = response_totals(addr, server)
    # A measurement interval, not a wait for a condition.
    time.sleep(PROXY_MEASURE_SECS)
    total2, ok2 = response_totals(addr, server)
    t2 = time.monotonic()
    requests = total2 - total1
    proxy_rps = requests / (t2 - t1)
    if requests <= 0:
        raise Failure(f"the proxy at {addr} counted no responses from {server} in {t2 - t1:.1f} s")
    page = b.read(row_selector("deployment", ns, server))
    dash_rps = float(figure(page["fields"], "rps"))
    allowed = RPS_TOLERANCE * proxy_rps + RPS_SLACK
    log(
        f"proxy {addr}: {requests:.0f} responses from {server} in {t2 - t1:.1f} s = {proxy_rps:.2f} rps; "
        f"dashboard {dash_rps:.2f} rps (allowed difference {allowed:.2f})"
    )
    if abs(dash_rps - proxy_rps) > allowed:
        raise Failure(
            f"deploy/{server}: the dashboard shows {dash_rps:.2f} rps, the client proxy counted "
            f"{proxy_rps:.2f} rps (more than {RPS_TOLERANCE:.0%} + {RPS_SLACK} apart)"
        )
    success = figure(page["fields"], "success_rate")
    if ok2 - ok1 == requests:
        if success == "" or float(success) != 1.0:
            raise Failure(f"deploy/{server}: the proxy saw 100% success, the dashboard shows {success!r}")
        log("success: 100% at the proxy and on the dashboard")
    else:
        proxy_sr = (ok2 - ok1) / requests
        if success == "" or abs(float(success) - proxy_sr) > 0.05:
            raise Failure(f"deploy/{server}: proxy success {proxy_sr:.4f}, dashboard {success!r}")
        log(f"success: proxy {proxy_sr:.4f}, dashboard {success}")


def check_pods(b, api, ns, client):
    """Meshed pods with the collector's state of each; pods without a proxy
    (the demo's backends) as not meshed, from the clients' view."""
    b.open(f"#/pods?namespace={ns}")

    def same(_):
        rows = b.read_all('[data-testid="pod-row"]')
        got = {(r["dataset"]["namespace"], r["dataset"]["name"]): r for r in rows}
        pods = api(f"/api/pods?namespace={ns}")["pods"]
        if not pods:
            raise Failure("/api/pods lists no pod")
        for p in pods:
            key = (p["pod"]["namespace"], p["pod"]["name"])
            row = got.pop(key, None)
            if row is None:
                raise Failure(f"pod {key} missing from the page")
            if row["dataset"]["state"] != p["state"] or row["fields"]["addr"]["value"] != p["addr"]:
                raise Failure(f"pod {key}: page {row['dataset']['state']} {row['fields']['addr']['value']}, API {p['state']} {p['addr']}")
        scraped = {(p["pod"]["namespace"], p["pod"]["name"]) for p in pods}
        unmeshed = {
            (r["resource"]["namespace"], r["resource"]["name"])
            for r in api(f"/api/stat?kind=pod&namespace={ns}")["rows"]
        } - scraped
        if set(got) != unmeshed or any(r["dataset"]["state"] != "unmeshed" for r in got.values()):
            raise Failure(f"unmeshed pods: page {sorted(got)}, API {sorted(unmeshed)}")
        return rows

    rows = b.wait("the pods page to list the API's pods and states", same)
    clients = [r for r in rows if r["fields"]["workload"]["value"] == f"deployment/{client}"]
    if not any(r["dataset"]["state"] == "ok" for r in clients):
        raise Failure(f"no pod of deploy/{client} shown as ok: {rows}")
    log(f"pods: {len(rows)} rows, states " + ", ".join(f"{r['dataset']['name']} {r['dataset']['state']}" for r in rows))


def check_services(b, api, ns, server):
    b.open(f"#/services?namespace={ns}")
    check_stat_row(b, api, f"/api/stat?kind=service&namespace={ns}", "service", ns, server, f"svc/{server}")
    hint = b.read(row_selector("service", ns, server))["fields"]["source"]["text"]
    if hint != "as seen by clients":
        raise Failure(f"svc/{server}: the source hint reads {hint!r}")


def check_routes(b, api, ns):
    b.open(f"#/routes?namespace={ns}")

    def same(_):
        rows = api(f"/api/routes?namespace={ns}")["rows"]
        page = b.read_all('[data-testid="route-row"]')
        if len(page) != len(rows):
            raise Failure(f"{len(page)} route rows on the page, {len(rows)} in the API")
        for want in rows:
            key = (want["route"]["kind"], want["route"]["namespace"], want["route"]["name"])
            got = [p for p in page if (p["dataset"]["kind"], p["dataset"]["namespace"], p["dataset"]["name"]) == key]
            if not got:
                raise Failure(f"route {key} missing from the page")
            for field in GOLDEN:
                if not same_number(got[0]["fields"][field]["value"], want["golden"][field]):
                    raise Failure(f"route {key} {field}: page {got[0]['fields'][field]['value']}, API {want['golden'][field]}")
        return page or "no routes"

    page = b.wait("the routes page to show the API's routes", same, timeout=60)
    log(f"routes: {0 if page == 'no routes' else len(page)} rows, equal to the API")


def check_topology(b, api, ns, client, server):
    b.open(f"#/topology?namespace={ns}")
    src = f"deployment/{ns}/{client}"
    dst = f"deployment/{ns}/{server}"
    selector = f'[data-testid="edge"][data-src="{src}"][data-dst="{dst}"]'

    def same(_):
        page = b.read(selector)
        if page is None:
            raise Failure(f"no edge {src} -> {dst} drawn")
        edges = api(f"/api/edges?kind=deployment&namespace={ns}")["edges"]
        want = [e for e in edges if f"deployment/{e['src']['namespace']}/{e['src']['name']}" == src and f"{e['dst']['kind']}/{e['dst']['namespace']}/{e['dst']['name']}" == dst]
        if not want:
            raise Failure(f"/api/edges has no edge {src} -> {dst}")
        e = want[0]
        if page["dataset"]["mtls"] != str(e["mtls"]).lower():
            raise Failure(f"edge mtls: page {page['dataset']['mtls']}, API {e['mtls']}")
        if not same_number(page["dataset"]["rps"], e["golden"]["rps"]):
            raise Failure(f"edge rps: page {page['dataset']['rps']}, API {e['golden']['rps']}")
        nodes = b.driver.execute_script("return document.querySelectorAll('[data-testid=\"node\"]').length;")
        return (page, e, nodes)

    page, e, nodes = b.wait(f"the topology edge {client} -> {server} to match /api/edges", same)
    title = b.driver.execute_script(
        "const t = document.querySelector(arguments[0] + ' > title'); return t ? t.textContent : '';", selector
    )
    style = b.driver.execute_script(
        "const p = document.querySelector(arguments[0] + ' > path');"
        "const s = getComputedStyle(p); return {dash: s.strokeDasharray, stroke: s.stroke};",
        selector,
    )
    want_dashed = not e["mtls"]
    if (style["dash"] not in ("none", "")) != want_dashed:
        raise Failure(f"edge drawn with dasharray {style['dash']!r} but mtls={e['mtls']}")
    if not e["mtls"] and e["no_tls_reason"] not in title:
        raise Failure(f"the edge's hover text {title!r} lacks the reason {e['no_tls_reason']!r}")
    log(f"topology: {nodes} nodes; edge {client} -> {server}: {title!r}, stroke {style['stroke']} dash {style['dash']}")


def check_workload(b, api, ns, client, server):
    b.open(f"#/workload/deployment/{ns}/{client}")
    path = f"/api/workload?kind=deployment&namespace={ns}&name={client}"

    def outbound(_):
        w = api(path)
        rows = b.read_all('[data-testid="edge-row"][data-direction="outbound"]')
        dst = f"deployment/{ns}/{server}"
        if not any(r["dataset"]["dst"] == dst for r in rows):
            raise Failure(f"no outbound row to {dst}; page {[r['dataset']['dst'] for r in rows]}")
        if len(rows) != len(w["outbound"]):
            raise Failure(f"{len(rows)} outbound rows, API {len(w['outbound'])}")
        return rows

    b.wait(f"deploy/{client}'s page to list its outbound peer {server}", outbound)

    b.driver.find_element("css selector", '[data-testid="tap-start"]').click()

    def live_get_200(_):
        status = b.driver.find_element("css selector", '[data-testid="tap-status"]').text
        if status.startswith("tap failed"):
            raise Failure(status)
        rows = b.read_all('[data-testid="tap-row"]')
        good = [
            r for r in rows
            if r["fields"]["method"]["value"] == "GET" and r["fields"]["status"]["value"] == "200"
        ]
        if not good:
            raise Failure(f"tap status {status!r}, {len(rows)} rows")
        return good

    good = b.wait("a live tap row with GET and status 200", live_get_200, timeout=60)
    r = good[0]["fields"]
    log(
        f"tap: a live {r['method']['value']} {r['path']['value']} -> {r['status']['value']} in "
        f"{r['latency_ms']['text']}, {r['source']['value']} -> {r['destination']['value']} "
        f"(identities {r['source'].get('identity')!r} -> {r['destination'].get('identity')!r})"
    )

    # Stop aborts the stream: no row arrives after it, across two polls.
    b.driver.find_element("css selector", '[data-testid="tap-stop"]').click()
    b.wait("the tap to stop", lambda d: d.find_element("css selector", '[data-testid="tap-status"]').text == "stopped", timeout=10)
    count = b.driver.execute_script("return document.querySelector('[data-testid=\"tap-count\"]').dataset.value;")
    for _ in range(2):
        updated = b.updated_at()
        b.wait("another poll", lambda _: b.updated_at() > updated, timeout=20)
    after = b.driver.execute_script("return document.querySelector('[data-testid=\"tap-count\"]').dataset.value;")
    if after != count:
        raise Failure(f"tap rows kept arriving after Stop: {count} -> {after}")
    log(f"tap: stopped at {count} requests, none after")


def check_console(b, allow=None):
    b.drain_console()
    bad = [
        e for e in b.console
        if e.get("level") == "SEVERE" and not (allow and allow(e))
    ]
    if bad:
        raise Failure("console errors:\n  " + "\n  ".join(f"{e.get('source')}: {e.get('message')}" for e in bad))


def blocked(entry):
    """The browser's own log line for a request check_error_banner blocked."""
    return entry.get("source") == "network" and "ERR_BLOCKED_BY_CLIENT" in entry.get("message", "")


def check_error_banner(b, ns, server):
    """With the API unreachable the page says so and keeps its figures; it
    recovers by itself."""
    b.open(f"#/deployments?namespace={ns}")
    check_console(b)
    b.console.clear()
    b.driver.execute_cdp_cmd("Network.enable", {})
    b.driver.execute_cdp_cmd("Network.setBlockedURLs", {"urls": ["*/api/*"]})
    try:
        def shown(_):
            ban = b.banner()
            if ban["hidden"] or ban["kind"] != "error":
                raise Failure(f"banner {ban}")
            return ban

        ban = b.wait("the error banner while the API is blocked", shown, timeout=20)
        if b.read(row_selector("deployment", ns, server)) is None:
            raise Failure("the figures vanished while the API was unreachable")
        log(f"banner: {ban['text']!r}")
        b.screenshot("error-banner", docs=False)
    finally:
        b.driver.execute_cdp_cmd("Network.setBlockedURLs", {"urls": []})

    def gone(_):
        ban = b.banner()
        if not ban["hidden"] and ban["kind"] == "error":
            raise Failure(f"banner {ban}")
        return True

    b.wait("the banner to go once the API answers again", gone, timeout=20)
    # Only the blocked requests themselves may be logged, by the browser's
    # network layer; the page's own code logs nothing.
    check_console(b, allow=blocked)
    log("banner: shown while the API was blocked, gone after; no console error from the page")


def tour(b, ns, client):
    """Screenshots of every page once the checks held (with a longer
    history for the sparklines by then)."""
    for name, fragment in [
        ("overview", "#/"),
        ("workloads", f"#/deployments?namespace={ns}"),
        ("pods", f"#/pods?namespace={ns}"),
        ("services", f"#/services?namespace={ns}"),
        ("routes", f"#/routes?namespace={ns}"),
        ("topology", f"#/topology?namespace={ns}"),
    ]:
        b.open(fragment)
        b.screenshot(name)
    b.open(f"#/workload/deployment/{ns}/{client}")
    b.driver.find_element("css selector", '[data-testid="tap-start"]').click()
    # A fuller picture; not a check (that was check_workload's).
    try:
        b.wait("a screenful of tap rows", lambda _: len(b.read_all('[data-testid="tap-row"]')) >= 10, timeout=10)
    except Failure:
        pass
    b.screenshot("workload")
    b.driver.find_element("css selector", '[data-testid="tap-stop"]').click()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preflight", action="store_true", help="only check that a browser is here")
    p.add_argument("--url", help="the dashboard, e.g. http://127.0.0.1:8084/")
    p.add_argument("--out", help="directory for screenshots")
    p.add_argument("--docs", help="also copy the screenshots here")
    p.add_argument("--namespace", default="demo")
    p.add_argument("--client", default="load", help="the meshed client deployment")
    p.add_argument("--server", default="web", help="the deployment it calls")
    p.add_argument("--deadline", type=float, default=200, help="seconds for the whole check")
    args = p.parse_args()

    try:
        import selenium  # noqa: F401
    except ImportError as e:
        unavailable(f"python3-selenium: {e}")
    chromium, chromedriver = browser_paths()
    if args.preflight:
        print(f"browser: {chromium}, {chromedriver}, selenium {selenium.__version__}")
        return
    if not args.url or not args.out:
        p.error("--url and --out are required")

    deadline = time.monotonic() + args.deadline
    api = Api(args.url)
    b = Browser(args.url, args.out, args.docs, deadline)
    ns, client, server = args.namespace, args.client, args.server
    try:
        check_overview(b, api, ns)
        check_workloads(b, api, ns, server)
        check_live_update(b, api, ns, server)
        check_against_proxy(b, api, ns, client, server)
        check_pods(b, api, ns, client)
        check_services(b, api, ns, server)
        check_routes(b, api, ns)
        check_topology(b, api, ns, client, server)
        check_workload(b, api, ns, client, server)
        check_console(b)
        log(f"console: {len(b.console)} entries, none SEVERE")
        check_error_banner(b, ns, server)
        tour(b, ns, client)
        check_console(b, allow=blocked)
    except Failure as e:
        print(f"FAIL: {e}", flush=True)
        try:
            b.drain_console()
            for entry in b.console[-20:]:
                print(f"  console {entry.get('level')} {entry.get('source')}: {entry.get('message')}")
            os.makedirs(args.out, exist_ok=True)
            b.driver.save_screenshot(os.path.join(args.out, "failure.png"))
            print(f"  page {b.driver.current_url}; screenshot {os.path.join(args.out, 'failure.png')}")
        except Exception as e2:  # the report of a failure must not hide it
            print(f"  (no screenshot: {e2})")
        sys.exit(1)
    finally:
        b.quit()
    log("PASS: every dashboard check held")


if __name__ == "__main__":
    main()
