#!/usr/bin/env python3
"""Checks the dashboard on what a live demo never shows, served by
fixture.py: markup in names, errors and paths stays text; an unreachable pod
is flagged with its reason; unknown figures read `-`; a non-mTLS edge is
dashed with its reason on hover, a cycle and a self-call are drawn; the API
failing shows its error in a banner while the last figures stay, a stalled
collector shows a warning, and both go once things recover; the Tap panel
shows notices and events. The browser's console stays free of errors except
the failed requests the fixture was told to fail.

Exit 0: every check held; 1: one failed; 3: no browser here.
"""

import argparse
import sys
import time

import check
from check import Failure, log, row_selector

import fixture

PWNED = "return [window.__pwned === undefined, document.querySelectorAll('img[src=\"x\"], svg[onload], script:not([src])').length];"


def not_pwned(b):
    clean, injected = b.driver.execute_script(PWNED)
    if not clean or injected:
        raise Failure(f"markup from the API ran or was parsed: __pwned set {not clean}, {injected} injected elements")


def check_workloads(b):
    b.open("#/deployments")
    hostile = b.read(row_selector("deployment", fixture.NS, fixture.HOSTILE_NAME))
    if hostile is None or hostile["fields"]["name"]["text"] != fixture.HOSTILE_NAME + fixture.NS:
        raise Failure(f"the hostile name is not shown as text: {hostile}")
    if hostile["fields"]["source"]["text"] != "as seen by clients":
        raise Failure(f"source hint: {hostile['fields']['source']}")
    api = b.read(row_selector("deployment", fixture.NS, "api"))
    badge = b.driver.execute_script(
        "const r = document.querySelector(arguments[0]);"
        "const u = r.querySelector('[data-testid=\"unreachable\"]');"
        "return [r.classList.contains('unreachable'), u ? u.textContent : null];",
        row_selector("deployment", fixture.NS, "api"),
    )
    if badge != [True, "1 unreachable"] or api["fields"]["meshed"]["value"] != "2/3":
        raise Failure(f"deploy/api's unreachable pod is not flagged: {badge}, meshed {api['fields']['meshed']}")
    idle = b.read(row_selector("deployment", fixture.NS, "idle"))
    for field in ["success_rate", "p50_ms", "p95_ms", "p99_ms"]:
        cell = idle["fields"][field]
        if cell != {"value": "", "identity": None, "text": "-"}:
            raise Failure(f"deploy/idle {field} with no requests reads {cell}, not '-'")
    if idle["fields"]["source"]["text"] != "no data":
        raise Failure(f"deploy/idle source hint {idle['fields']['source']}")
    not_pwned(b)
    log("workloads: markup shown as text, 1 unreachable flagged, unknown figures '-'")


def check_pods(b):
    b.open("#/pods")
    broken = b.read('[data-testid="pod-row"][data-name="api-2"]')
    if broken is None or broken["dataset"]["state"] != "unreachable":
        raise Failure(f"pod api-2 not shown unreachable: {broken}")
    reason = broken["fields"]["last_error"]
    if reason["value"] != fixture.HOSTILE_ERROR or not reason["text"].startswith(fixture.HOSTILE_ERROR):
        raise Failure(f"pod api-2's reason: {reason}")
    if "next try in 8 s" not in reason["text"]:
        raise Failure(f"pod api-2's backoff is not shown: {reason['text']!r}")
    not_pwned(b)
    log(f"pods: api-2 unreachable, reason {reason['text']!r}")


def check_topology(b):
    b.open("#/topology")
    n = b.driver.execute_script("return document.querySelectorAll('[data-testid=\"edge\"]').length;")
    if n != len(fixture.EDGES):
        raise Failure(f"{n} edges drawn, {len(fixture.EDGES)} in the API")
    selector = f'[data-testid="edge"][data-src="deployment/{fixture.NS}/api"][data-dst="deployment/{fixture.NS}/db"]'
    info = b.driver.execute_script(
        "const g = document.querySelector(arguments[0]);"
        "return [g.querySelector('title').textContent, getComputedStyle(g.querySelector('path')).strokeDasharray,"
        " g.querySelectorAll('.edge-lock').length];",
        selector,
    )
    title, dash, locks = info
    if fixture.HOSTILE_REASON not in title or dash in ("none", "") or locks != 0:
        raise Failure(f"the non-mTLS edge: title {title!r}, dash {dash!r}, {locks} locks")
    locked = b.driver.execute_script("return document.querySelectorAll('[data-testid=\"edge\"][data-mtls=\"true\"] .edge-lock').length;")
    if locked != sum(1 for e in fixture.EDGES if e["mtls"]):
        raise Failure(f"{locked} locks drawn on mTLS edges")
    not_pwned(b)
    log(f"topology: {n} edges (a cycle, a self-call), the plain one dashed with {title!r}")


def check_tap(b):
    b.open(f"#/workload/deployment/{fixture.NS}/load")
    b.driver.find_element("css selector", '[data-testid="tap-start"]').click()

    def rows(_):
        r = b.read_all('[data-testid="tap-row"]')
        if len(r) < 3:
            raise Failure(f"{len(r)} tap rows")
        return r

    got = b.wait("tap rows from the fixture", rows, timeout=20)
    path = got[0]["fields"]["path"]
    if path["text"] != fixture.HOSTILE_PATH:
        raise Failure(f"tap path shown as {path}")
    notices = b.driver.execute_script("return document.querySelector('[data-testid=\"tap-notices\"]').textContent;")
    if f"cannot tap: {fixture.HOSTILE_ERROR}" not in notices:
        raise Failure(f"the tap notice is not shown: {notices!r}")
    b.driver.find_element("css selector", '[data-testid="tap-stop"]').click()
    not_pwned(b)
    log(f"tap: {len(got)} rows, path as text, notice {notices!r}")


def check_failures(b, base):
    b.open("#/deployments")
    check.check_console(b)
    b.console.clear()
    check.get(base + "fixture/fail")

    def banner(kind, text):
        def probe(_):
            ban = b.banner()
            if ban["hidden"] or ban["kind"] != kind or text not in ban["text"]:
                raise Failure(f"banner {ban}")
            return ban
        return probe

    try:
        ban = b.wait("the API's own error in the banner", banner("error", fixture.FAIL_MESSAGE), timeout=15)
        if b.read(row_selector("deployment", fixture.NS, "api")) is None:
            raise Failure("the last figures vanished when the API failed")
        log(f"banner on failure: {ban['text']!r}")
        check.get(base + "fixture/stale")
        ban = b.wait("the stale collector warning", banner("warn", "stale"), timeout=15)
        log(f"banner on a stalled collector: {ban['text']!r}")
    finally:
        check.get(base + "fixture/normal")
    b.wait("the banner to go", lambda _: b.banner()["hidden"], timeout=15)
    check.check_console(
        b, allow=lambda e: e.get("source") == "network" and "503" in e.get("message", "")
    )
    log("banner: gone after recovery; no console error but the failed requests")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--deadline", type=float, default=90)
    args = p.parse_args()
    try:
        import selenium  # noqa: F401
    except ImportError as e:
        check.unavailable(f"python3-selenium: {e}")
    base = args.url.rstrip("/") + "/"
    b = check.Browser(base, args.out, None, time.monotonic() + args.deadline)
    try:
        check_workloads(b)
        check_pods(b)
        check_topology(b)
        check_tap(b)
        check.check_console(b)
        check_failures(b, base)
        b.screenshot("hostile-last", docs=False)
    except Failure as e:
        print(f"FAIL: {e}", flush=True)
        b.drain_console()
        for entry in b.console[-20:]:
            print(f"  console {entry.get('level')} {entry.get('source')}: {entry.get('message')}")
        b.driver.save_screenshot(f"{args.out}/hostile-failure.png")
        sys.exit(1)
    finally:
        b.quit()
    log("PASS: every edge case held")


if __name__ == "__main__":
    main()
