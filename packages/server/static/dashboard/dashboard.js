// The Sluice dashboard: asks for an admin token, keeps it in this tab's session storage, and
// polls the overview route with it. Plain browser JavaScript, no build step: edit and reload.
// Everything shown is set as text, never as HTML: tenant names and limits come from users.
/* global document, sessionStorage, fetch, clearTimeout */
'use strict';

const OVERVIEW = '/api/client/v1/ops/overview';
const EVERY_MS = 2000;
const KEY = 'sluice.dashboard.token';
const BUDGETS = ['requests', 'tokens', 'inputTokens', 'outputTokens'];
const STATUSES = ['scheduled', 'queued', 'running', 'requires_action', 'succeeded', 'failed', 'canceled'];

const $ = (id) => document.getElementById(id);
let timer;
let generation = 0;

function cell(text, className) {
  const td = document.createElement('td');
  td.textContent = String(text);
  if (className) td.className = className;
  return td;
}

function numberCell(value, name) {
  const td = cell(value, value === 0 ? 'n zero' : 'n');
  td.dataset.field = name;
  return td;
}

function bar(value, className) {
  const span = document.createElement('span');
  span.className = className ? `bar ${className}` : 'bar';
  span.style.width = `${Math.min(value, 50) * 4}px`;
  return span;
}

function fill(tableId, rows, emptyId) {
  const body = $(tableId).tBodies[0];
  body.replaceChildren(...rows);
  $(emptyId).hidden = rows.length > 0;
}

function drawLimiters(limiters) {
  fill(
    'limiters',
    limiters.map((l) => {
      const tr = document.createElement('tr');
      tr.dataset.limiter = l.limiter;
      tr.dataset.workload = l.workload;
      const active = numberCell(l.active, 'active');
      active.append(bar(l.active));
      const queued = numberCell(l.queued, 'queued');
      queued.append(bar(l.queued, 'queued'));
      tr.append(
        cell(l.limiter),
        cell(l.workload),
        active,
        queued,
        cell(l.source === 'stats' ? 'the limiter (all servers)' : 'this server’s runs'),
      );
      return tr;
    }),
    'limiters-empty',
  );
}

// A budget as "available / per minute", whole tokens: a bucket refills continuously, so the
// figure it gives is fractional. A budget the limiter does not have is a dash.
function budgetCell(budget, name) {
  const td = cell(budget ? `${Math.floor(budget.available)} / ${budget.capacity}` : '–', 'n');
  td.dataset.field = name;
  return td;
}

function drawCapacity(capacity) {
  fill(
    'capacity',
    capacity.map((c) => {
      const tr = document.createElement('tr');
      tr.dataset.limiter = c.limiter;
      const limit = cell(c.limit === undefined ? '–' : c.limit, 'n');
      limit.dataset.field = 'limit';
      const throttled = numberCell(c.throttled === undefined ? '–' : c.throttled, 'throttled');
      if (c.lastThrottledAt) throttled.title = `last ${new Date(c.lastThrottledAt).toLocaleTimeString()}`;
      tr.append(cell(c.limiter), limit, ...BUDGETS.map((b) => budgetCell(c.budgets[b], b)), throttled);
      return tr;
    }),
    'capacity-empty',
  );
}

function drawRuns(runs) {
  const groups = new Map();
  for (const r of runs) {
    const key = `${r.tenant}\u0000${r.class}`;
    if (!groups.has(key)) groups.set(key, { tenant: r.tenant, class: r.class, counts: {} });
    groups.get(key).counts[r.status] = r.count;
  }
  fill(
    'runs',
    [...groups.values()].map((g) => {
      const tr = document.createElement('tr');
      tr.dataset.tenant = g.tenant;
      tr.dataset.class = g.class;
      tr.append(cell(g.tenant), cell(g.class), ...STATUSES.map((s) => numberCell(g.counts[s] ?? 0, s)));
      return tr;
    }),
    'runs-empty',
  );
}

function drawGateways(gateways) {
  fill(
    'gateways',
    gateways.map((g) => {
      const tr = document.createElement('tr');
      tr.dataset.tenant = g.tenant;
      tr.dataset.gateway = g.gateway;
      const s = g.statuses || {};
      const other = Object.entries(s)
        .filter(([k]) => k !== '2xx' && k !== '429')
        .reduce((n, [, v]) => n + v, 0);
      tr.append(
        cell(g.tenant),
        cell(g.gateway),
        numberCell(g.requests, 'requests'),
        numberCell(g.open, 'open'),
        numberCell(s['2xx'] || 0, '2xx'),
        numberCell(s['429'] || 0, '429'),
        numberCell(other, 'errors'),
        numberCell(g.inputTokens, 'inputTokens'),
        numberCell(g.outputTokens, 'outputTokens'),
      );
      return tr;
    }),
    'gateways-empty',
  );
}

function drawWaiting(waiting) {
  fill(
    'waiting',
    (waiting ?? []).map((w) => {
      const tr = document.createElement('tr');
      tr.dataset.tenant = w.tenant;
      tr.dataset.reason = w.reason;
      tr.append(cell(w.tenant), cell(w.reason), cell(String(w.count), 'n'));
      return tr;
    }),
    'waiting-empty',
  );
}

function drawRefusals(refusals) {
  fill(
    'refusals',
    refusals.map((r) => {
      const tr = document.createElement('tr');
      const count = r.current === null ? '' : `${r.current} / ${r.limit}`;
      tr.append(
        cell(new Date(r.at).toLocaleTimeString()),
        cell(r.tenant),
        cell(r.class),
        cell(r.outcome),
        cell(r.scope),
        cell(count, 'n'),
      );
      return tr;
    }),
    'refusals-empty',
  );
}

function signedOut(message) {
  clearTimeout(timer);
  generation++;
  sessionStorage.removeItem(KEY);
  $('board').hidden = true;
  $('sign-in').hidden = false;
  $('sign-out').hidden = true;
  $('status').textContent = 'not signed in';
  const error = $('sign-in-error');
  error.textContent = message || '';
  error.hidden = !message;
}

async function poll(token, mine) {
  let next = EVERY_MS;
  try {
    const response = await fetch(OVERVIEW, {
      headers: { authorization: `Bearer ${token}` },
      cache: 'no-store',
      credentials: 'omit',
    });
    if (mine !== generation) return;
    if (response.status === 401 || response.status === 403) {
      const body = await response.json().catch(() => ({}));
      signedOut((body.error && body.error.message) || `refused (${response.status})`);
      return;
    }
    if (!response.ok) throw new Error(`the server answered ${response.status}`);
    const overview = await response.json();
    if (mine !== generation) return;
    $('sign-in').hidden = true;
    $('sign-in-error').hidden = true;
    $('board').hidden = false;
    $('sign-out').hidden = false;
    drawLimiters(overview.limiters);
    drawCapacity(overview.capacity || []);
    drawRuns(overview.runs);
    drawGateways(overview.gateways || []);
    drawRefusals(overview.refusals);
    drawWaiting(overview.waiting);
    $('status').textContent = `updated ${new Date(overview.at).toLocaleTimeString()}`;
    document.body.dataset.updatedAt = overview.at;
  } catch (error) {
    if (mine !== generation) return;
    // A restart or a network blip: say so, and keep trying a little slower.
    $('status').textContent = `no answer (${error.message}); retrying`;
    next = EVERY_MS * 2;
  }
  timer = setTimeout(() => poll(token, mine), next);
}

function start(token) {
  clearTimeout(timer);
  const mine = ++generation;
  $('status').textContent = 'loading';
  void poll(token, mine);
}

document.addEventListener('DOMContentLoaded', () => {
  $('sign-in').addEventListener('submit', (event) => {
    event.preventDefault();
    const token = $('token').value.trim();
    $('token').value = '';
    if (!token) return;
    sessionStorage.setItem(KEY, token);
    start(token);
  });
  $('sign-out').addEventListener('click', () => signedOut());
  const saved = sessionStorage.getItem(KEY);
  if (saved) start(saved);
});
