// The Ballast dashboard: one page over the viz server's JSON API (the types
// are crates/vizcore/src/api.rs). Hash routes, a poll every POLL_MS that
// redraws the figures in place, a Tap panel that streams NDJSON.
//
// No build step and no dependencies. Every string from the API reaches the
// page as text (textContent, attribute values), never as markup: the page's
// CSP is `default-src 'self'`, so there is no inline script or style either.

const POLL_MS = 2000;
/// A poll that takes longer is abandoned (and shown as an error).
const FETCH_TIMEOUT_MS = 8000;
/// Tap rows kept on the page, newest first.
const TAP_ROWS = 100;
/// A Tap line longer than this ends the stream: the server never sends one.
const TAP_MAX_LINE = 1 << 20;
const SVG_NS = 'http://www.w3.org/2000/svg';

const WORKLOAD_KINDS = ['deployment', 'statefulset', 'daemonset', 'job'];
const KIND_TITLES = {
  namespace: 'Namespaces',
  deployment: 'Deployments',
  statefulset: 'StatefulSets',
  daemonset: 'DaemonSets',
  job: 'Jobs',
  pod: 'Pods',
  service: 'Services',
};
/// `ballast tap` target prefixes (Linkerd's short names).
const TAP_KINDS = {
  deployment: 'deploy',
  statefulset: 'sts',
  daemonset: 'ds',
  job: 'job',
  pod: 'pod',
  namespace: 'ns',
};

// ---------------------------------------------------------------- DOM

/// An HTML element. `props`: class, testid, data (data-* attributes),
/// attrs, on (event listeners), title. Children: nodes, or strings and
/// numbers (as text), nested arrays; null/undefined/false are skipped.
function h(tag, props, ...children) {
  const el = document.createElement(tag);
  applyProps(el, props);
  append(el, children);
  return el;
}

/// The same for SVG elements.
function s(tag, props, ...children) {
  const el = document.createElementNS(SVG_NS, tag);
  applyProps(el, props);
  append(el, children);
  return el;
}

function applyProps(el, props) {
  if (!props) return;
  if (props.class) el.setAttribute('class', props.class);
  if (props.testid) el.setAttribute('data-testid', props.testid);
  if (props.title) el.setAttribute('title', props.title);
  for (const [k, v] of Object.entries(props.data || {})) {
    if (v !== undefined && v !== null) el.setAttribute(`data-${k}`, String(v));
  }
  for (const [k, v] of Object.entries(props.attrs || {})) {
    if (v !== undefined && v !== null && v !== false) el.setAttribute(k, String(v));
  }
  for (const [k, v] of Object.entries(props.on || {})) el.addEventListener(k, v);
}

function append(el, children) {
  for (const c of children) {
    if (c === null || c === undefined || c === false) continue;
    if (Array.isArray(c)) append(el, c);
    else if (c instanceof Node) el.appendChild(c);
    else el.appendChild(document.createTextNode(String(c)));
  }
}

function link(href, ...children) {
  return h('a', { attrs: { href } }, ...children);
}

// ---------------------------------------------------------------- formats

function fmtRps(x) {
  if (x === null || x === undefined) return '-';
  if (x === 0) return '0';
  if (x < 10) return x.toFixed(2);
  if (x < 1000) return x.toFixed(1);
  return Math.round(x).toLocaleString('en-US');
}

function fmtPct(x) {
  if (x === null || x === undefined) return '-';
  return `${(x * 100).toFixed(2)}%`;
}

function fmtMs(x) {
  if (x === null || x === undefined) return '-';
  if (x < 10) return `${x.toFixed(2)} ms`;
  if (x < 1000) return `${Math.round(x)} ms`;
  return `${(x / 1000).toFixed(2)} s`;
}

function fmtCount(x) {
  if (x === null || x === undefined) return '-';
  return String(x);
}

function pad2(n) {
  return String(n).padStart(2, '0');
}

function fmtClock(date) {
  return `${pad2(date.getHours())}:${pad2(date.getMinutes())}:${pad2(date.getSeconds())}`;
}

/// Unix seconds as local wall time.
function fmtUnix(secs) {
  if (secs === null || secs === undefined) return '-';
  return fmtClock(new Date(secs * 1000));
}

/// A class for a success rate: good, warn, bad, or none.
function rateClass(x) {
  if (x === null || x === undefined) return 'none';
  if (x >= 0.99) return 'good';
  if (x >= 0.95) return 'warn';
  return 'bad';
}

function refKey(r) {
  return `${r.kind}/${r.namespace}/${r.name}`;
}

function refLabel(r) {
  return `${r.kind}/${r.name}`;
}

function workloadHref(r) {
  return `#/workload/${encodeURIComponent(r.kind)}/${encodeURIComponent(r.namespace)}/${encodeURIComponent(r.name)}`;
}

/// Where a resource's name links to, or null.
function hrefOf(r) {
  if (r.kind === 'namespace') return `#/deployments?namespace=${encodeURIComponent(r.name)}`;
  if (r.kind === 'service') {
    return `#/routes?namespace=${encodeURIComponent(r.namespace)}&target=${encodeURIComponent(`svc/${r.name}`)}`;
  }
  if (WORKLOAD_KINDS.includes(r.kind) || r.kind === 'pod') return workloadHref(r);
  return null;
}

const SOURCE_HINTS = {
  clients: 'as seen by clients',
  none: 'no data',
};
const SOURCE_TITLES = {
  inbound: 'served, as counted by its own proxies',
  clients: 'no meshed pod of its own answered: what meshed clients saw when calling it',
  none: 'no requests in the window',
};

// ---------------------------------------------------------------- API

class ApiError extends Error {}

/// GETs `path` as JSON; throws ApiError with a one-line reason.
async function api(path, signal) {
  let res;
  try {
    res = await fetch(path, { signal, headers: { Accept: 'application/json' } });
  } catch (e) {
    if (e.name === 'AbortError') throw e;
    throw new ApiError(`${path}: ${e.message || 'network error'}`);
  }
  let body = null;
  try {
    body = await res.json();
  } catch (e) {
    if (e.name === 'AbortError') throw e;
    throw new ApiError(`${path}: HTTP ${res.status}, not JSON`);
  }
  if (!res.ok) {
    const reason = body && typeof body.error === 'string' ? body.error : `HTTP ${res.status}`;
    throw new ApiError(`${path}: ${reason}`);
  }
  return body;
}

function query(params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) {
    if (v !== undefined && v !== null && v !== '') q.set(k, v);
  }
  const text = q.toString();
  return text ? `?${text}` : '';
}

// ---------------------------------------------------------------- sparklines

/// A small line chart of `values` (nulls are gaps). `fixed`: [min, max] of
/// the scale, else from the data.
function sparkline(values, { width = 90, height = 22, fixed = null, cls = '', label = '', fmt = String } = {}) {
  const svg = s('svg', {
    class: `spark ${cls}`,
    attrs: { width, height, viewBox: `0 0 ${width} ${height}`, role: 'img' },
    data: { points: values.length },
  });
  const present = values.filter((v) => v !== null && v !== undefined);
  if (present.length === 0) {
    svg.appendChild(s('title', null, `${label}: no data`));
    svg.appendChild(s('line', { class: 'spark-empty', attrs: { x1: 0, y1: height - 1, x2: width, y2: height - 1 } }));
    return svg;
  }
  let [lo, hi] = fixed || [Math.min(...present), Math.max(...present)];
  if (!fixed) lo = Math.min(lo, 0);
  if (hi === lo) hi = lo + 1;
  const n = values.length;
  const x = (i) => (n === 1 ? width - 1 : 1 + (i * (width - 2)) / (n - 1));
  const y = (v) => height - 2 - ((v - lo) * (height - 4)) / (hi - lo);
  let d = '';
  let pen = false;
  values.forEach((v, i) => {
    if (v === null || v === undefined) {
      pen = false;
      return;
    }
    d += `${pen ? 'L' : 'M'}${x(i).toFixed(1)},${y(v).toFixed(1)}`;
    pen = true;
  });
  const last = present[present.length - 1];
  svg.appendChild(
    s('title', null, `${label}: last ${fmt(last)}, min ${fmt(Math.min(...present))}, max ${fmt(Math.max(...present))} (${n} points)`),
  );
  svg.appendChild(s('path', { class: 'spark-line', attrs: { d } }));
  // A dot on the newest point, so one point still shows.
  for (let i = n - 1; i >= 0; i--) {
    if (values[i] !== null && values[i] !== undefined) {
      svg.appendChild(s('circle', { class: 'spark-dot', attrs: { cx: x(i).toFixed(1), cy: y(values[i]).toFixed(1), r: 1.6 } }));
      break;
    }
  }
  return svg;
}

function sparkCells(spark, size) {
  const sp = spark || { rps: [], success_rate: [], p99_ms: [] };
  return [
    h('td', { class: 'spark-cell', data: { field: 'spark-rps' } }, sparkline(sp.rps || [], { ...size, cls: 'rps', label: 'RPS', fmt: fmtRps })),
    h(
      'td',
      { class: 'spark-cell', data: { field: 'spark-success' } },
      sparkline(sp.success_rate || [], { ...size, cls: 'sr', fixed: [0, 1], label: 'success', fmt: fmtPct }),
    ),
    h('td', { class: 'spark-cell', data: { field: 'spark-p99' } }, sparkline(sp.p99_ms || [], { ...size, cls: 'p99', label: 'p99', fmt: fmtMs })),
  ];
}

// ---------------------------------------------------------------- tables

/// A cell holding a figure: the formatted text, and the raw number in
/// `data-value` (empty when unknown) for tests and tools.
function fig(field, raw, text, cls) {
  return h(
    'td',
    { class: `num ${cls || ''}`, data: { field, value: raw === null || raw === undefined ? '' : String(raw) } },
    text,
  );
}

function goldenCells(g) {
  return [
    fig('success_rate', g.success_rate, fmtPct(g.success_rate), `rate-${rateClass(g.success_rate)}`),
    fig('rps', g.rps, fmtRps(g.rps)),
    fig('p50_ms', g.p50_ms, fmtMs(g.p50_ms)),
    fig('p95_ms', g.p95_ms, fmtMs(g.p95_ms)),
    fig('p99_ms', g.p99_ms, fmtMs(g.p99_ms)),
  ];
}

const GOLDEN_HEADS = ['Success', 'RPS', 'P50', 'P95', 'P99'];

/// The three sparkline columns under one heading.
const HISTORY_HEAD = { text: 'History: RPS \u00b7 success \u00b7 p99', span: 3 };

/// `heads`: strings, or `{ text, span }` for a heading over several columns.
function table(testid, heads, rows, empty, props = {}) {
  const columns = heads.reduce((n, head) => n + (head.span || 1), 0);
  const body = rows.length
    ? rows
    : [h('tr', { class: 'empty', testid: 'empty' }, h('td', { attrs: { colspan: columns } }, empty))];
  return h(
    'table',
    { class: 'grid', testid, ...props },
    h('thead', null, h('tr', null, heads.map((head) => (typeof head === 'string' ? h('th', null, head) : h('th', { attrs: { colspan: head.span } }, head.text))))),
    h('tbody', null, body),
  );
}

function nameCell(r, showNamespace) {
  const href = hrefOf(r);
  const name = href ? link(href, r.name) : h('span', null, r.name);
  return h(
    'td',
    { class: 'name', data: { field: 'name', value: r.name } },
    name,
    showNamespace && r.kind !== 'namespace' ? h('span', { class: 'ns' }, r.namespace) : null,
  );
}

function sourceHint(source) {
  const hint = SOURCE_HINTS[source];
  if (!hint) return null;
  return h('span', { class: `hint hint-${source}`, testid: 'source', title: SOURCE_TITLES[source] || '' }, hint);
}

function meshedCell(row) {
  const unreachable = row.unreachable_pods > 0;
  return h(
    'td',
    { class: 'num meshed', data: { field: 'meshed', value: `${row.meshed_pods}/${row.total_pods}`, unreachable: row.unreachable_pods } },
    `${row.meshed_pods}/${row.total_pods}`,
    unreachable
      ? h(
          'span',
          { class: 'badge bad', testid: 'unreachable', title: 'meshed pods whose last scrape failed: their figures are missing, not zero' },
          `${row.unreachable_pods} unreachable`,
        )
      : null,
  );
}

/// The table of `GET /api/stat` rows.
function statTable(kind, rows, { showNamespace = true, sparkSize } = {}) {
  const heads = [kind === 'namespace' ? 'Namespace' : 'Name', 'Meshed', ...GOLDEN_HEADS, 'TCP', HISTORY_HEAD, 'Source'];
  const trs = rows.map((row) => {
    const r = row.resource;
    const t = row.spark && row.spark.t && row.spark.t.length ? row.spark.t[row.spark.t.length - 1] : '';
    return h(
      'tr',
      {
        testid: 'stat-row',
        class: row.unreachable_pods > 0 ? 'unreachable' : '',
        data: { kind: r.kind, namespace: r.namespace, name: r.name, source: row.source, cycle: t },
        title: SOURCE_TITLES[row.source] || '',
      },
      nameCell(r, showNamespace),
      meshedCell(row),
      goldenCells(row.golden),
      fig('tcp_connections', row.tcp_connections, fmtCount(row.tcp_connections)),
      sparkCells(row.spark, sparkSize),
      h('td', { class: 'source', data: { field: 'source', value: row.source } }, sourceHint(row.source)),
    );
  });
  const title = KIND_TITLES[kind] || kind;
  return table('stat-table', heads, trs, `No ${title.toLowerCase()} with figures yet.`, { data: { kind } });
}

/// A pod's figures from its stat row (none when it has no row).
function podFigures(row) {
  const g = row ? row.golden : {};
  return [
    fig('success_rate', g.success_rate, fmtPct(g.success_rate), `rate-${rateClass(g.success_rate)}`),
    fig('rps', row ? g.rps : null, row ? fmtRps(g.rps) : '-'),
    fig('p99_ms', g.p99_ms, fmtMs(g.p99_ms)),
    sparkCells(row ? row.spark : null),
    h('td', { class: 'source', data: { field: 'source', value: row ? row.source : '' } }, row ? sourceHint(row.source) : null),
  ];
}

function section(title, ...children) {
  return h('section', { class: 'card' }, h('h2', null, title), children);
}

// ---------------------------------------------------------------- router

/// The route from the hash: `{ name, parts, params }`.
function parseHash() {
  const raw = location.hash.replace(/^#\/?/, '');
  const [path, qs] = raw.split('?', 2);
  const parts = path.split('/').filter((p) => p !== '').map((p) => decodeURIComponent(p));
  const params = new URLSearchParams(qs || '');
  const name = parts[0] || 'overview';
  return { name, parts: parts.slice(1), params };
}

function routeHash(route, params) {
  const path = [route.name, ...route.parts].map(encodeURIComponent).join('/');
  const qs = params.toString();
  return `#/${path}${qs ? `?${qs}` : ''}`;
}

// ---------------------------------------------------------------- views
//
// A view: `title(route)`, `load(ctx)` → data (throws on an API failure),
// `render(root, data, ctx)` redraws the live figures, and optionally
// `mount(static, ctx)` once per visit for parts that outlive polls (Tap).

const views = {
  overview: {
    title: () => 'Overview',
    load: async (ctx) => ({ overview: ctx.overview }),
    render(root, { overview }, ctx) {
      const c = overview.collector;
      const item = (field, label, value, text, cls) =>
        h('div', { class: `stat ${cls || ''}`, data: { field, value: value === null || value === undefined ? '' : value } }, h('dt', null, label), h('dd', null, text));
      const rows = ctx.namespace ? overview.namespaces.filter((r) => r.resource.name === ctx.namespace) : overview.namespaces;
      root.append(
        section(
          'Collector',
          h(
            'dl',
            { class: 'stats', testid: 'collector' },
            item('source', 'Source', c.source, c.source === 'prometheus' ? 'Prometheus (federate)' : 'scraping proxies'),
            item('interval_secs', 'Interval', c.interval_secs, `${c.interval_secs} s`),
            item('history', 'History', c.history_points, `${c.history_points} points (${Math.round((c.history_points * c.interval_secs) / 60)} min)`),
            item('pods_known', 'Meshed pods', c.pods_known, String(c.pods_known)),
            item('pods_ok', 'Answering', c.pods_ok, String(c.pods_ok), c.pods_ok > 0 ? 'good' : ''),
            item('pods_unreachable', 'Unreachable', c.pods_unreachable, String(c.pods_unreachable), c.pods_unreachable > 0 ? 'bad' : ''),
            item('last_cycle_ms', 'Last cycle', c.last_cycle_ms, c.last_cycle_ms === null ? '-' : fmtMs(c.last_cycle_ms)),
            item('last_cycle_at', 'Last cycle at', c.last_cycle_at, fmtUnix(c.last_cycle_at)),
          ),
        ),
        section('Namespaces', statTable('namespace', rows, { showNamespace: false })),
      );
    },
  },

  namespaces: {
    title: () => 'Namespaces',
    load: async (ctx) => ({ stat: await api('/api/stat?kind=namespace', ctx.signal) }),
    render(root, { stat }, ctx) {
      const rows = ctx.namespace ? stat.rows.filter((r) => r.resource.name === ctx.namespace) : stat.rows;
      root.append(section('Namespaces', windowNote(stat), statTable('namespace', rows, { showNamespace: false })));
    },
  },

  deployments: {
    title: () => 'Workloads',
    async load(ctx) {
      const stats = await Promise.all(WORKLOAD_KINDS.map((kind) => api(`/api/stat${query({ kind, namespace: ctx.namespace })}`, ctx.signal)));
      return { stats };
    },
    render(root, { stats }, ctx) {
      stats.forEach((stat, i) => {
        const kind = WORKLOAD_KINDS[i];
        // Deployments always; the other kinds once there are some.
        if (kind !== 'deployment' && stat.rows.length === 0) return;
        root.append(section(KIND_TITLES[kind], windowNote(stat), statTable(kind, stat.rows, { showNamespace: !ctx.namespace })));
      });
    },
  },

  services: {
    title: () => 'Services',
    load: async (ctx) => ({ stat: await api(`/api/stat${query({ kind: 'service', namespace: ctx.namespace })}`, ctx.signal) }),
    render(root, { stat }, ctx) {
      root.append(
        section(
          'Services',
          h('p', { class: 'note' }, 'A service has no proxy of its own: its figures are what its meshed clients saw when calling it.'),
          windowNote(stat),
          statTable('service', stat.rows, { showNamespace: !ctx.namespace }),
        ),
      );
    },
  },

  pods: {
    title: () => 'Pods',
    async load(ctx) {
      const [pods, stat] = await Promise.all([
        api(`/api/pods${query({ namespace: ctx.namespace })}`, ctx.signal),
        api(`/api/stat${query({ kind: 'pod', namespace: ctx.namespace })}`, ctx.signal),
      ]);
      return { pods, stat };
    },
    render(root, { pods, stat }, ctx) {
      const byPod = new Map(stat.rows.map((r) => [refKey(r.resource), r]));
      const scraped = new Set(pods.pods.map((p) => refKey(p.pod)));
      const trs = pods.pods.map((p) => {
        const row = byPod.get(refKey(p.pod));
        return h(
          'tr',
          { testid: 'pod-row', class: p.state === 'unreachable' ? 'unreachable' : '', data: { namespace: p.pod.namespace, name: p.pod.name, state: p.state } },
          nameCell(p.pod, !ctx.namespace),
          h('td', { data: { field: 'workload', value: p.workload ? refLabel(p.workload) : '' } }, p.workload ? link(workloadHref(p.workload), refLabel(p.workload)) : '-'),
          h('td', { class: 'addr', data: { field: 'addr', value: p.addr } }, p.addr),
          h('td', { data: { field: 'state', value: p.state } }, h('span', { class: `badge state-${p.state}` }, p.state)),
          h(
            'td',
            { class: 'reason', data: { field: 'last_error', value: p.last_error || '' } },
            p.last_error || '',
            p.state === 'unreachable' && p.next_attempt_in_secs !== null && p.next_attempt_in_secs !== undefined
              ? h('span', { class: 'muted' }, ` (${p.consecutive_failures} failed; next try in ${p.next_attempt_in_secs} s)`)
              : null,
          ),
          fig('last_scrape_at', p.last_scrape_at, fmtUnix(p.last_scrape_at)),
          podFigures(row),
        );
      });
      // Pods without a proxy: only what their meshed clients saw.
      for (const row of stat.rows) {
        if (scraped.has(refKey(row.resource))) continue;
        const r = row.resource;
        trs.push(
          h(
            'tr',
            { testid: 'pod-row', class: 'unmeshed', data: { namespace: r.namespace, name: r.name, state: 'unmeshed' } },
            nameCell(r, !ctx.namespace),
            h('td', { data: { field: 'workload', value: '' } }, '-'),
            h('td', { class: 'addr', data: { field: 'addr', value: '' } }, '-'),
            h('td', { data: { field: 'state', value: 'unmeshed' } }, h('span', { class: 'badge state-unmeshed', title: 'no proxy to scrape' }, 'not meshed')),
            h('td', { class: 'reason', data: { field: 'last_error', value: '' } }),
            fig('last_scrape_at', null, '-'),
            podFigures(row),
          ),
        );
      }
      const heads = ['Pod', 'Workload', 'Admin', 'Collector', 'Reason', 'Last scrape', 'Success', 'RPS', 'P99', HISTORY_HEAD, 'Source'];
      root.append(section('Pods', table('pods-table', heads, trs, 'No pods with a proxy or with meshed clients found.')));
    },
  },

  routes: {
    title: () => 'Routes',
    load: async (ctx) => ({
      routes: await api(`/api/routes${query({ target: ctx.route.params.get('target'), namespace: ctx.namespace })}`, ctx.signal),
    }),
    render(root, { routes }) {
      root.append(section(routes.target ? `Routes of ${routes.target}` : 'Routes', h('p', { class: 'note' }, 'As counted by the clients\u2019 proxies, per route.'), routeTable(routes.rows)));
    },
  },

  topology: {
    title: () => 'Topology',
    async load(ctx) {
      const [edges, stat] = await Promise.all([
        api(`/api/edges${query({ kind: 'deployment', namespace: ctx.namespace })}`, ctx.signal),
        api(`/api/stat${query({ kind: 'deployment', namespace: ctx.namespace })}`, ctx.signal),
      ]);
      return { edges, stat };
    },
    render(root, { edges, stat }) {
      root.append(
        section(
          'Topology',
          h('p', { class: 'legend' }, legendItem('mtls', 'mutual TLS'), legendItem('plain', 'not mutual TLS (hover an edge for why)'), 'Arrows point from caller to callee; labels: requests per second and success rate.'),
          topology(edges.edges, stat.rows),
        ),
      );
    },
  },

  workload: {
    title: (route) => (route.parts.length >= 3 ? `${route.parts[0]}/${route.parts[2]}` : 'Workload'),
    async load(ctx) {
      const [kind, namespace, name] = ctx.route.parts;
      if (!kind || !namespace || !name) throw new ApiError('the address is #/workload/KIND/NAMESPACE/NAME');
      return { w: await api(`/api/workload${query({ kind, namespace, name })}`, ctx.signal) };
    },
    mount(root, ctx) {
      const [kind, namespace, name] = ctx.route.parts;
      if (kind && namespace && name) {
        app.tap = tapPanel(kind, namespace, name, ctx);
        root.append(app.tap.el);
      }
    },
    render(root, { w }, ctx, top) {
      const r = w.stat.resource;
      if (app.tap) app.tap.setTappable(w.stat.meshed_pods);
      const g = w.stat.golden;
      const card = (field, label, raw, text, cls) =>
        h('div', { class: `stat ${cls || ''}`, testid: 'workload-stat', data: { field, value: raw === null || raw === undefined ? '' : raw } }, h('dt', null, label), h('dd', null, text));
      const size = { width: 260, height: 48 };
      top.append(
        h(
          'section',
          { class: 'card', testid: 'workload', data: { kind: r.kind, namespace: r.namespace, name: r.name, source: w.stat.source } },
          h('h2', null, `${r.kind}/${r.name}`, h('span', { class: 'ns' }, `namespace ${r.namespace}`), sourceHint(w.stat.source)),
          h(
            'dl',
            { class: 'stats' },
            card('success_rate', 'Success', g.success_rate, fmtPct(g.success_rate), `rate-${rateClass(g.success_rate)}`),
            card('rps', 'RPS', g.rps, fmtRps(g.rps)),
            card('p50_ms', 'P50', g.p50_ms, fmtMs(g.p50_ms)),
            card('p95_ms', 'P95', g.p95_ms, fmtMs(g.p95_ms)),
            card('p99_ms', 'P99', g.p99_ms, fmtMs(g.p99_ms)),
            card('meshed', 'Meshed', `${w.stat.meshed_pods}/${w.stat.total_pods}`, `${w.stat.meshed_pods}/${w.stat.total_pods}`, w.stat.unreachable_pods > 0 ? 'bad' : ''),
            card('tcp_connections', 'TCP', w.stat.tcp_connections, fmtCount(w.stat.tcp_connections)),
          ),
          h(
            'div',
            { class: 'big-sparks' },
            bigSpark('RPS', sparkline(w.stat.spark.rps || [], { ...size, cls: 'rps', label: 'RPS', fmt: fmtRps })),
            bigSpark('Success', sparkline(w.stat.spark.success_rate || [], { ...size, cls: 'sr', fixed: [0, 1], label: 'success', fmt: fmtPct })),
            bigSpark('P99', sparkline(w.stat.spark.p99_ms || [], { ...size, cls: 'p99', label: 'p99', fmt: fmtMs })),
          ),
        ),
      );
      root.append(
        section('Inbound: who calls it', edgeTable('inbound', w.inbound)),
        section('Outbound: what it calls', edgeTable('outbound', w.outbound)),
        section('Routes', routeTable(w.routes)),
        section('Pods', statTable('pod', w.pods, { showNamespace: false })),
      );
    },
  },
};

function windowNote(stat) {
  return h('p', { class: 'note' }, `Over the last ${stat.window_secs} s; one sparkline point per ${stat.interval_secs} s.`);
}

function bigSpark(label, svg) {
  return h('figure', null, svg, h('figcaption', null, label));
}

function legendItem(cls, text) {
  return h('span', { class: 'legend-item' }, s('svg', { attrs: { width: 34, height: 10 } }, s('line', { class: `edge-line ${cls}`, attrs: { x1: 1, y1: 5, x2: 33, y2: 5 } })), text);
}

function tlsText(e) {
  if (e.mtls) return e.server_id ? `mTLS, server identity ${e.server_id}` : 'mTLS';
  return `not mTLS: ${e.no_tls_reason || 'unknown'}`;
}

function edgeTable(direction, edges) {
  const peer = direction === 'inbound' ? 'src' : 'dst';
  const trs = edges.map((e) =>
    h(
      'tr',
      { testid: 'edge-row', data: { direction, src: refKey(e.src), dst: refKey(e.dst), mtls: e.mtls } },
      nameCell(e[peer], true),
      h('td', { class: 'kind' }, e[peer].kind),
      h('td', { class: `tls ${e.mtls ? 'mtls' : 'plain'}`, data: { field: 'mtls', value: e.mtls }, title: tlsText(e) }, e.mtls ? lockIcon() : null, e.mtls ? 'mTLS' : e.no_tls_reason || 'no'),
      goldenCells(e.golden),
    ),
  );
  const heads = [direction === 'inbound' ? 'From' : 'To', 'Kind', 'TLS', ...GOLDEN_HEADS];
  return table(`${direction}-table`, heads, trs, direction === 'inbound' ? 'No meshed callers seen.' : 'No outbound traffic seen.');
}

function routeTable(rows) {
  const trs = rows.map((row) =>
    h(
      'tr',
      { testid: 'route-row', data: { kind: row.route.kind, namespace: row.route.namespace, name: row.route.name, parent: refKey(row.parent) } },
      h('td', { class: 'name', data: { field: 'route', value: row.route.name } }, row.route.name, h('span', { class: 'ns' }, row.route.kind)),
      h('td', { data: { field: 'parent', value: refKey(row.parent) } }, `${row.parent.kind === 'service' ? 'svc' : row.parent.kind}/${row.parent.name}`, h('span', { class: 'ns' }, row.parent.namespace)),
      fig('parent_port', row.parent_port, fmtCount(row.parent_port)),
      goldenCells(row.golden),
      sparkCells(row.spark),
    ),
  );
  return table('routes-table', ['Route', 'Parent', 'Port', ...GOLDEN_HEADS, HISTORY_HEAD], trs, 'No route metrics yet (they come from clients calling services through the proxy).');
}

function lockIcon() {
  return s(
    'svg',
    { class: 'lock', attrs: { width: 10, height: 12, viewBox: '0 0 10 12', 'aria-hidden': 'true' } },
    s('rect', { attrs: { x: 1, y: 5, width: 8, height: 6.5, rx: 1 } }),
    s('path', { attrs: { d: 'M2.8,5 V3.4 a2.2,2.2 0 0 1 4.4,0 V5', fill: 'none' } }),
  );
}

// ---------------------------------------------------------------- topology

const NODE_W = 210;
const NODE_H = 62;
const COL_W = 370;
const ROW_H = 100;
const MARGIN = 30;
/// Room above the graph for back edges (callee to an earlier layer).
const TOP = 60;

/// Layers by call depth: callers left of callees (longest path; a cycle is
/// broken at its alphabetically first node). Everything is sorted first,
/// so the same graph is always drawn the same way.
function layers(keys, edges) {
  const preds = new Map(keys.map((k) => [k, new Set()]));
  for (const e of edges) {
    const a = refKey(e.src);
    const b = refKey(e.dst);
    if (a !== b) preds.get(b).add(a);
  }
  const layer = new Map();
  const remaining = new Set(keys);
  while (remaining.size > 0) {
    let ready = [...remaining].filter((k) => [...preds.get(k)].every((p) => !remaining.has(p)));
    if (ready.length === 0) ready = [[...remaining].sort()[0]];
    for (const k of ready.sort()) {
      let depth = 0;
      for (const p of preds.get(k)) if (layer.has(p)) depth = Math.max(depth, layer.get(p) + 1);
      layer.set(k, depth);
      remaining.delete(k);
    }
  }
  return layer;
}

function topology(edges, statRows) {
  const nodes = new Map();
  const stats = new Map(statRows.map((r) => [refKey(r.resource), r]));
  for (const r of statRows) nodes.set(refKey(r.resource), r.resource);
  for (const e of edges) {
    nodes.set(refKey(e.src), e.src);
    nodes.set(refKey(e.dst), e.dst);
  }
  const keys = [...nodes.keys()].sort();
  if (keys.length === 0) {
    return h('p', { class: 'empty', testid: 'empty' }, 'No workloads with traffic yet.');
  }
  const layer = layers(keys, edges);
  const columns = [];
  for (const k of keys) {
    const l = layer.get(k);
    (columns[l] = columns[l] || []).push(k);
  }
  const tallest = Math.max(...columns.map((c) => (c ? c.length : 0)));
  const pos = new Map();
  columns.forEach((col, l) => {
    if (!col) return;
    const offset = ((tallest - col.length) * ROW_H) / 2;
    col.forEach((k, i) => pos.set(k, { x: MARGIN + l * COL_W, y: TOP + offset + i * ROW_H }));
  });
  const width = Math.max(MARGIN * 2 + (columns.length - 1) * COL_W + NODE_W, 600);
  const height = TOP + MARGIN + (tallest - 1) * ROW_H + NODE_H;

  const svg = s('svg', {
    class: 'topology',
    testid: 'topology',
    attrs: { viewBox: `0 0 ${width} ${height}`, width, height, role: 'img', 'aria-label': 'workload topology' },
    data: { nodes: keys.length, edges: edges.length },
  });
  svg.appendChild(
    s(
      'defs',
      null,
      ['mtls', 'plain'].map((cls) =>
        s('marker', { attrs: { id: `arrow-${cls}`, viewBox: '0 0 10 10', refX: 9, refY: 5, markerWidth: 7, markerHeight: 7, orient: 'auto-start-reverse' } }, s('path', { class: `arrow ${cls}`, attrs: { d: 'M0,0 L10,5 L0,10 z' } })),
      ),
    ),
  );

  const sorted = [...edges].sort((a, b) => `${refKey(a.src)} ${refKey(a.dst)}`.localeCompare(`${refKey(b.src)} ${refKey(b.dst)}`));
  for (const e of sorted) svg.appendChild(edgeShape(e, pos.get(refKey(e.src)), pos.get(refKey(e.dst))));
  for (const k of keys) svg.appendChild(nodeShape(nodes.get(k), pos.get(k), stats.get(k)));
  return h('div', { class: 'topology-wrap' }, svg);
}

function edgeShape(e, a, b) {
  const cls = e.mtls ? 'mtls' : 'plain';
  let d;
  let mid;
  if (refKey(e.src) === refKey(e.dst)) {
    // A loop over the node's top right corner.
    const x = a.x + NODE_W - 30;
    const y = a.y;
    d = `M${x},${y} C${x - 10},${y - 40} ${x + 40},${y - 40} ${x + 30},${y}`;
    mid = { x: x + 100, y: y - 14 };
  } else if (b.x > a.x) {
    const x1 = a.x + NODE_W;
    const y1 = a.y + NODE_H / 2;
    const x2 = b.x - 2;
    const y2 = b.y + NODE_H / 2;
    const c = (x2 - x1) / 2;
    d = `M${x1},${y1} C${x1 + c},${y1} ${x2 - c},${y2} ${x2},${y2}`;
    mid = { x: (x1 + x2) / 2, y: (y1 + y2) / 2 };
  } else {
    // Back (or same-layer) edge: an arc over both nodes, top to top.
    const x1 = a.x + NODE_W / 2 + 20;
    const y1 = a.y;
    const x2 = b.x + NODE_W / 2 - 20;
    const y2 = b.y - 2;
    const peak = Math.min(y1, y2) - 55;
    d = `M${x1},${y1} C${x1},${peak} ${x2},${peak} ${x2},${y2}`;
    mid = { x: (x1 + x2) / 2, y: (y1 + y2) / 8 + (peak * 3) / 4 + 4 };
  }
  const g = e.golden;
  const label = `${fmtRps(g.rps)} rps \u00b7 ${fmtPct(g.success_rate)}`;
  return s(
    'g',
    { class: `edge ${cls}`, testid: 'edge', data: { src: refKey(e.src), dst: refKey(e.dst), mtls: e.mtls, rps: g.rps, success: g.success_rate === null ? '' : g.success_rate } },
    s('title', null, `${refLabel(e.src)} \u2192 ${refLabel(e.dst)}: ${tlsText(e)}; ${label}`),
    s('path', { class: `edge-line ${cls}`, attrs: { d, 'marker-end': `url(#arrow-${cls})` } }),
    e.mtls ? s('g', { class: 'edge-lock', attrs: { transform: `translate(${(mid.x - label.length * 3.4 - 13).toFixed(1)},${(mid.y - 16).toFixed(1)})` } }, lockShape()) : null,
    s('text', { class: 'edge-label', attrs: { x: mid.x.toFixed(1), y: (mid.y - 6).toFixed(1), 'text-anchor': 'middle' } }, label),
  );
}

function lockShape() {
  return [s('rect', { attrs: { x: 0, y: 5, width: 8, height: 6.5, rx: 1 } }), s('path', { attrs: { d: 'M1.8,5 V3.4 a2.2,2.2 0 0 1 4.4,0 V5', fill: 'none' } })];
}

function nodeShape(r, p, stat) {
  const g = stat ? stat.golden : null;
  const rate = g ? rateClass(g.success_rate) : 'none';
  const figures = g ? `${fmtRps(g.rps)} rps \u00b7 ${fmtPct(g.success_rate)} \u00b7 p99 ${fmtMs(g.p99_ms)}` : 'no figures';
  const body = s(
    'g',
    { class: `node rate-${rate}`, testid: 'node', data: { kind: r.kind, namespace: r.namespace, name: r.name } },
    s('title', null, `${refLabel(r)} in ${r.namespace}`),
    s('rect', { attrs: { x: p.x, y: p.y, width: NODE_W, height: NODE_H, rx: 8 } }),
    s('text', { class: 'node-name', attrs: { x: p.x + 12, y: p.y + 20 } }, clip(r.name, 24)),
    s('text', { class: 'node-sub', attrs: { x: p.x + 12, y: p.y + 37 } }, clip(`${r.kind} \u00b7 ${r.namespace}`, 34)),
    s('text', { class: 'node-figures', attrs: { x: p.x + 12, y: p.y + 53 } }, clip(figures, 36)),
  );
  const href = hrefOf(r);
  return href ? s('a', { attrs: { href } }, body) : body;
}

function clip(text, n) {
  return text.length > n ? `${text.slice(0, n - 1)}\u2026` : text;
}

// ---------------------------------------------------------------- tap

/// The live requests of one workload, from `GET /api/tap` (NDJSON). Stays
/// on the page across polls; leaving the page stops it.
function tapPanel(kind, namespace, name, ctx) {
  const target = `${TAP_KINDS[kind] || kind}/${name}`;
  const events = [];
  let controller = null;
  let dirty = false;
  const status = h('span', { class: 'tap-status', testid: 'tap-status' }, 'stopped');
  const notices = h('ul', { class: 'tap-notices', testid: 'tap-notices' });
  const tbody = h('tbody');
  const count = h('span', { class: 'muted', testid: 'tap-count', data: { value: 0 } }, '');
  let seen = 0;
  const start = h('button', { testid: 'tap-start', attrs: { type: 'button' }, on: { click: () => begin() } }, 'Start');
  const stop = h('button', { testid: 'tap-stop', attrs: { type: 'button', disabled: true }, on: { click: () => end('stopped') } }, 'Stop');
  const clear = h('button', { testid: 'tap-clear', attrs: { type: 'button' }, on: { click: () => { events.length = 0; draw(); } } }, 'Clear');

  const hint = h('span', { class: 'muted', testid: 'tap-hint' });
  let tappable = true;
  const setRunning = (running) => {
    start.disabled = running || !tappable;
    stop.disabled = !running;
  };
  const setStatus = (text, cls) => {
    status.textContent = text;
    status.className = `tap-status ${cls || ''}`;
  };
  const notice = (text) => {
    notices.prepend(h('li', null, `${fmtClock(new Date())} ${text}`));
    while (notices.childElementCount > 5) notices.lastElementChild.remove();
  };
  const draw = () => {
    dirty = false;
    tbody.replaceChildren(
      ...(events.length
        ? events.map(tapRow)
        : [h('tr', { class: 'empty', testid: 'empty' }, h('td', { attrs: { colspan: 9 } }, controller ? 'Waiting for requests…' : 'Press Start to watch live requests.'))]),
    );
    count.textContent = seen ? `${seen} seen, last ${events.length} shown` : '';
    count.setAttribute('data-value', String(seen));
  };
  const push = (ev) => {
    seen += 1;
    events.unshift(ev);
    if (events.length > TAP_ROWS) events.length = TAP_ROWS;
    if (!dirty) {
      dirty = true;
      requestAnimationFrame(draw);
    }
  };
  const end = (why, cls) => {
    if (controller) controller.abort();
    controller = null;
    setRunning(false);
    setStatus(why, cls);
    draw();
  };
  async function begin() {
    if (controller) return;
    const mine = new AbortController();
    controller = mine;
    setRunning(true);
    setStatus('connecting…', 'live');
    draw();
    try {
      const res = await fetch(`/api/tap${query({ target, namespace })}`, { signal: mine.signal, headers: { Accept: 'application/x-ndjson' } });
      if (!res.ok) {
        let reason = `HTTP ${res.status}`;
        try {
          const body = await res.json();
          if (body && typeof body.error === 'string') reason = body.error;
        } catch (_) {
          // Not JSON: the status says enough.
        }
        if (controller === mine) end(`tap failed: ${reason}`, 'bad');
        return;
      }
      setStatus('live', 'live');
      const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
      let buf = '';
      for (;;) {
        const { value, done } = await reader.read();
        // A read that finished as Stop was pressed: drop it.
        if (controller !== mine) return;
        if (done) break;
        buf += value;
        let nl;
        while ((nl = buf.indexOf('\n')) >= 0) {
          const line = buf.slice(0, nl).trim();
          buf = buf.slice(nl + 1);
          if (line) handleLine(line);
        }
        if (buf.length > TAP_MAX_LINE) throw new ApiError('a tap line over 1 MiB');
      }
      if (controller === mine) end('the stream ended', 'warn');
    } catch (e) {
      if (e.name === 'AbortError' || controller !== mine) return;
      end(`tap failed: ${e.message || e}`, 'bad');
    }
  }
  function handleLine(line) {
    let obj;
    try {
      obj = JSON.parse(line);
    } catch (_) {
      notice('an unreadable line was skipped');
      return;
    }
    if (obj && typeof obj.notice === 'string') notice(obj.notice);
    else if (obj && typeof obj.method === 'string') push({ ...obj, seenAt: fmtClock(new Date()) });
  }

  /// Only proxies can be tapped: with no meshed pod there is nothing to start.
  const setTappable = (meshedPods) => {
    tappable = meshedPods > 0;
    hint.textContent = tappable ? '' : 'no meshed pod to tap (Tap is served by the proxies)';
    setRunning(controller !== null);
  };

  ctx.onLeave(() => end('stopped'));
  draw();
  const el = h(
    'section',
    { class: 'card tap', testid: 'tap' },
    h('h2', null, 'Live requests (tap)', h('span', { class: 'ns' }, target)),
    h('div', { class: 'tap-controls' }, start, stop, clear, status, count, hint),
    notices,
    h(
      'div',
      { class: 'tap-scroll' },
      h(
        'table',
        { class: 'grid tap-table', testid: 'tap-table' },
        h('thead', null, h('tr', null, ['Time', 'Dir', 'Method', 'Path', 'Status', 'Latency', 'Source', 'Destination', 'TLS'].map((t) => h('th', null, t)))),
        tbody,
      ),
    ),
  );
  return { el, setTappable };
}

function tapRow(ev) {
  const status = ev.status !== null && ev.status !== undefined ? ev.status : null;
  const statusCls = ev.error ? 'bad' : status === null ? '' : status >= 500 ? 'bad' : status >= 400 ? 'warn' : 'good';
  const peer = (addr, identity, workload) =>
    h('span', { class: 'peer' }, workload || addr, identity ? h('span', { class: 'identity' }, identity) : h('span', { class: 'identity muted' }, workload ? addr : 'no identity'));
  return h(
    'tr',
    { testid: 'tap-row', data: { id: ev.id, proxy: ev.proxy } },
    h('td', { class: 'muted' }, ev.seenAt),
    h('td', { data: { field: 'direction', value: ev.direction } }, ev.direction),
    h('td', { data: { field: 'method', value: ev.method } }, ev.method),
    h('td', { class: 'path', data: { field: 'path', value: ev.path }, title: `${ev.scheme}://${ev.authority}${ev.path}` }, ev.path),
    h('td', { class: `num rate-${statusCls}`, data: { field: 'status', value: status === null ? '' : status }, title: ev.error || '' }, status === null ? ev.error || '-' : String(status)),
    fig('latency_ms', ev.latency_ms, fmtMs(ev.latency_ms)),
    h('td', { data: { field: 'source', value: ev.source, identity: ev.source_identity || '' } }, peer(ev.source, ev.source_identity, ev.source_workload)),
    h('td', { data: { field: 'destination', value: ev.destination, identity: ev.destination_identity || '' } }, peer(ev.destination, ev.destination_identity, ev.destination_workload)),
    h('td', { data: { field: 'tls', value: ev.tls } }, ev.tls ? lockIcon() : 'no'),
  );
}

// ---------------------------------------------------------------- the app

const app = {
  route: null,
  namespace: '',
  /// Bumped on every navigation: an answer for an older route is dropped.
  generation: 0,
  poll: null,
  timer: null,
  leaveHooks: [],
  /// The workload page's Tap panel, while it is shown.
  tap: null,
  lastOk: null,
  namespaces: [],
};

const $ = (id) => document.getElementById(id);

function setBanner(text, cls) {
  const banner = $('banner');
  if (!text) {
    banner.hidden = true;
    banner.textContent = '';
    banner.removeAttribute('data-kind');
    return;
  }
  banner.hidden = false;
  banner.className = `banner ${cls}`;
  banner.setAttribute('data-kind', cls);
  banner.textContent = text;
}

function setUpdated(overview) {
  const now = new Date();
  app.lastOk = now;
  const el = $('last-updated');
  el.textContent = `updated ${fmtClock(now)}`;
  el.setAttribute('data-value', String(now.getTime()));
  el.setAttribute('data-cycle', String(overview.collector.last_cycle_at ?? ''));
  const c = overview.collector;
  const brief = $('collector-brief');
  brief.textContent = `${c.pods_ok}/${c.pods_known} pods answering${c.pods_unreachable ? `, ${c.pods_unreachable} unreachable` : ''}`;
  brief.className = c.pods_unreachable ? 'bad' : '';
}

function updateNamespaceSelect(overview) {
  const names = overview.namespaces.map((r) => r.resource.name).sort();
  if (app.namespace && !names.includes(app.namespace)) names.push(app.namespace);
  if (names.join('\n') === app.namespaces.join('\n')) return;
  app.namespaces = names;
  const select = $('namespace');
  select.replaceChildren(h('option', { attrs: { value: '' } }, 'all'), ...names.map((n) => h('option', { attrs: { value: n } }, n)));
  select.value = app.namespace;
}

/// How stale the figures are, from the server's own clock.
function collectorWarning(overview) {
  const c = overview.collector;
  if (c.last_cycle_at === null || c.last_cycle_at === undefined) {
    return c.pods_known > 0 ? 'The collector has not completed a scrape cycle yet.' : null;
  }
  const age = overview.generated_at - c.last_cycle_at;
  if (age > 3 * c.interval_secs + 5) return `The figures are stale: the collector's last cycle ended ${age} s ago (interval ${c.interval_secs} s).`;
  return null;
}

async function refresh() {
  const generation = app.generation;
  const view = views[app.route.name] || views.overview;
  clearTimeout(app.timer);
  if (app.poll) app.poll.abort();
  const poll = new AbortController();
  app.poll = poll;
  const timeout = setTimeout(() => poll.abort(), FETCH_TIMEOUT_MS);
  const ctx = { signal: poll.signal, route: app.route, namespace: app.namespace };
  try {
    ctx.overview = await api('/api/overview', poll.signal);
    const data = await view.load(ctx);
    if (generation !== app.generation) return;
    const live = $('live');
    const root = h('div', { class: 'live-inner' });
    const top = h('div', { class: 'live-inner' });
    view.render(root, data, ctx, top);
    $('live-top').replaceChildren(top);
    live.replaceChildren(root);
    live.setAttribute('data-state', 'ok');
    updateNamespaceSelect(ctx.overview);
    setUpdated(ctx.overview);
    const warning = collectorWarning(ctx.overview);
    setBanner(warning, warning ? 'warn' : '');
  } catch (e) {
    if (generation !== app.generation) return;
    const reason = e.name === 'AbortError' ? `no answer within ${FETCH_TIMEOUT_MS / 1000} s` : e.message || String(e);
    const since = app.lastOk ? ` Showing figures from ${fmtClock(app.lastOk)}.` : '';
    setBanner(`Cannot read the viz API: ${reason}.${since} Retrying every ${POLL_MS / 1000} s.`, 'error');
    $('live').setAttribute('data-state', 'error');
  } finally {
    clearTimeout(timeout);
    if (generation === app.generation) app.timer = setTimeout(refresh, POLL_MS);
  }
}

function navigate() {
  for (const hook of app.leaveHooks.splice(0)) hook();
  app.tap = null;
  app.generation += 1;
  app.route = parseHash();
  app.namespace = app.route.params.get('namespace') || '';
  const select = $('namespace');
  if (![...select.options].some((o) => o.value === app.namespace)) select.append(h('option', { attrs: { value: app.namespace } }, app.namespace));
  select.value = app.namespace;
  const view = views[app.route.name] || views.overview;
  for (const a of document.querySelectorAll('#nav a')) {
    // The nav keeps the namespace picked.
    const target = a.getAttribute('data-route');
    a.setAttribute('href', `#/${target === 'overview' ? '' : target}${app.namespace ? `?namespace=${encodeURIComponent(app.namespace)}` : ''}`);
    const active = a.getAttribute('data-route') === app.route.name;
    a.classList.toggle('active', active);
    if (active) a.setAttribute('aria-current', 'page');
    else a.removeAttribute('aria-current');
  }
  document.title = `${view.title(app.route)} · Ballast`;
  const main = $('view');
  main.setAttribute('data-route', app.route.name);
  const live = h('div', { attrs: { id: 'live' }, testid: 'live', data: { state: 'loading' } }, h('p', { class: 'muted' }, 'Loading…'));
  const fixed = h('div', { class: 'fixed' });
  // Views draw into live-top (above the fixed part, e.g. a workload's
  // summary over its Tap panel) and live (below it).
  main.replaceChildren(h('div', { attrs: { id: 'live-top' } }), fixed, live);
  if (view.mount) view.mount(fixed, { route: app.route, namespace: app.namespace, onLeave: (f) => app.leaveHooks.push(f) });
  refresh();
}

function init() {
  $('namespace').addEventListener('change', (ev) => {
    const route = parseHash();
    // A namespace picked on a workload page lists that namespace's workloads.
    if (route.name === 'workload') {
      route.name = 'deployments';
      route.parts = [];
    }
    const params = route.params;
    if (ev.target.value) params.set('namespace', ev.target.value);
    else params.delete('namespace');
    location.hash = routeHash(route, params);
  });
  window.addEventListener('hashchange', navigate);
  navigate();
}

init();
