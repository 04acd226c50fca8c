// The iop edge status page. One authenticated request feeds it: the admin
// event stream with snapshots (GET /admin/v1/events?snapshots=1), read with
// fetch because EventSource cannot send an Authorization header. Every
// value shown comes from that stream; data goes into the page as text only.
'use strict';

(() => {
  const TOKEN_KEY = 'iop-admin-token';
  const STREAM_URL = '/admin/v1/events?snapshots=1';
  const RATE_WINDOW_MS = 10000;
  // Shorter spans give rates too noisy to show.
  const RATE_MIN_MS = 3000;
  const STALE_MS = 5000;
  const MAX_EVENTS = 100;
  const MAX_BUFFER = 16 << 20;
  const BACKOFF_MIN_MS = 500;
  const BACKOFF_MAX_MS = 10000;

  const $ = (id) => document.getElementById(id);

  let token = sessionStorage.getItem(TOKEN_KEY);
  let controller = null;
  let retryTimer = null;
  let backoff = BACKOFF_MIN_MS;
  let live = false;
  let lastSnapshotAt = 0;
  let bounds = [];
  // Successive counters per model: [{ts, models: Map(name -> counters)}].
  let history = [];
  const lifecycle = [];
  const allEvents = [];

  // Builds an element; strings become text nodes (never parsed as HTML).
  function el(tag, props, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(props || {})) {
      if (k === 'class') e.className = v;
      else if (k.startsWith('data-')) e.setAttribute(k, String(v));
      else e[k] = v;
    }
    for (const c of children) {
      if (c === null || c === undefined) continue;
      e.append(c instanceof Node ? c : String(c));
    }
    return e;
  }

  function setConn(kind, text) {
    const c = $('conn');
    c.className = 'badge ' + kind;
    c.textContent = text;
    c.dataset.state = kind;
  }

  // ---- login -------------------------------------------------------------

  function stop() {
    live = false;
    clearTimeout(retryTimer);
    retryTimer = null;
    if (controller) controller.abort();
    controller = null;
  }

  function showLogin(message) {
    stop();
    token = null;
    sessionStorage.removeItem(TOKEN_KEY);
    $('status').hidden = true;
    $('logout').hidden = true;
    $('login').hidden = false;
    $('login-error').textContent = message || '';
    $('updated').textContent = '';
    setConn('off', 'not connected');
    $('token').focus();
  }

  function start() {
    $('login').hidden = true;
    $('status').hidden = false;
    $('logout').hidden = false;
    backoff = BACKOFF_MIN_MS;
    history = [];
    connect();
  }

  $('login-form').addEventListener('submit', (ev) => {
    ev.preventDefault();
    const t = $('token').value.trim();
    if (!t) return;
    $('token').value = '';
    token = t;
    sessionStorage.setItem(TOKEN_KEY, t);
    start();
  });
  $('logout').addEventListener('click', () => showLogin(''));
  $('show-runs').addEventListener('change', renderEvents);

  // ---- the stream --------------------------------------------------------

  function retry(why) {
    live = false;
    const wait = backoff;
    backoff = Math.min(backoff * 2, BACKOFF_MAX_MS);
    setConn('wait', `reconnecting in ${Math.ceil(wait / 1000)} s (${why})`);
    clearTimeout(retryTimer);
    retryTimer = setTimeout(connect, wait);
  }

  async function connect() {
    clearTimeout(retryTimer);
    if (controller) controller.abort();
    const mine = new AbortController();
    controller = mine;
    setConn('wait', 'connecting');
    let resp;
    try {
      resp = await fetch(STREAM_URL, {
        headers: { Authorization: 'Bearer ' + token, Accept: 'text/event-stream' },
        cache: 'no-store',
        credentials: 'omit',
        signal: mine.signal,
      });
    } catch (e) {
      if (!mine.signal.aborted) retry('edge unreachable');
      return;
    }
    if (resp.status === 401 || resp.status === 429) {
      // A right token is always granted: both mean a wrong one.
      const msg = resp.status === 429
        ? 'Wrong token, and too many failed attempts from this address: retry later.'
        : 'The edge refused this token.';
      showLogin(msg);
      return;
    }
    if (resp.status === 404) {
      showLogin('The admin API is disabled on this edge (no admin_token in its config).');
      return;
    }
    if (!resp.ok || !resp.body) {
      retry('HTTP ' + resp.status);
      return;
    }
    const reader = resp.body.getReader();
    const decoder = new TextDecoder();
    let buf = '';
    live = true;
    backoff = BACKOFF_MIN_MS;
    setConn('on', 'live');
    try {
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += decoder.decode(value, { stream: true });
        let end;
        while ((end = buf.indexOf('\n\n')) >= 0) {
          const block = buf.slice(0, end);
          buf = buf.slice(end + 2);
          onBlock(block);
        }
        if (buf.length > MAX_BUFFER) throw new Error('event too large');
      }
    } catch (e) {
      if (mine.signal.aborted) return;
    }
    if (!mine.signal.aborted) retry('stream ended');
  }

  // One SSE event: its `data:` lines joined; comments are ignored.
  function onBlock(block) {
    const data = [];
    for (let line of block.split('\n')) {
      if (line.endsWith('\r')) line = line.slice(0, -1);
      if (line.startsWith('data:')) data.push(line.slice(line.startsWith('data: ') ? 6 : 5));
    }
    if (data.length === 0) return;
    let msg;
    try {
      msg = JSON.parse(data.join('\n'));
    } catch (e) {
      return;
    }
    if (msg && msg.type === 'snapshot') onSnapshot(msg);
    else if (msg) onEvent(msg);
  }

  // ---- formatting --------------------------------------------------------

  function clock(ms) {
    const d = new Date(ms);
    return d.toLocaleTimeString([], { hour12: false });
  }

  function seconds(s) {
    if (s === null || s === undefined || !isFinite(s)) return '—';
    if (s < 1) return `${Math.round(s * 1000)} ms`;
    return `${s.toFixed(2)} s`;
  }

  function count(n) {
    return Number(n || 0).toLocaleString('en-US');
  }

  // Upper quantile estimate from per-bucket counts (the last bucket is
  // above every bound), interpolated inside its bucket as Prometheus does.
  function quantile(q, buckets) {
    const total = buckets.reduce((a, b) => a + b, 0);
    if (total === 0) return null;
    const rank = q * total;
    let seen = 0;
    for (let i = 0; i < buckets.length; i++) {
      if (buckets[i] > 0 && seen + buckets[i] >= rank) {
        if (i >= bounds.length) return bounds[bounds.length - 1];
        const lower = i === 0 ? 0 : bounds[i - 1];
        return lower + (bounds[i] - lower) * ((rank - seen) / buckets[i]);
      }
      seen += buckets[i];
    }
    return null;
  }

  // ---- snapshots ---------------------------------------------------------

  function countersOf(m) {
    const by = (m.requests && m.requests.by_status) || {};
    let notOk = 0;
    for (const [status, n] of Object.entries(by)) {
      if (!/^2\d\d$/.test(status)) notOk += n;
    }
    const t = m.ttft || { count: 0, sum_seconds: 0, buckets: [] };
    return { total: (m.requests && m.requests.total) || 0, notOk, ttft: t };
  }

  function onSnapshot(s) {
    lastSnapshotAt = Date.now();
    bounds = s.histogram_bounds_seconds || [];
    const models = new Map((s.models || []).map((m) => [m.name, countersOf(m)]));
    const last = history[history.length - 1];
    // Counters that went back: the edge restarted; start the window again.
    const restarted = last && [...models].some(([name, c]) => last.models.has(name) && c.total < last.models.get(name).total);
    if (restarted || (last && s.ts_ms < last.ts)) history = [];
    history.push({ ts: s.ts_ms, models });
    while (history.length > 2 && history[1].ts <= s.ts_ms - RATE_WINDOW_MS) history.shift();
    if (live) setConn('on', 'live');
    $('updated').textContent = 'updated ' + clock(s.ts_ms);
    renderNodes(s.nodes || []);
    renderModels(s.models || []);
  }

  function capacityCell(c) {
    const meter = el('meter', { min: 0, max: Math.max(c.configured, 1), value: c.in_use });
    const text = `${c.in_use} / ${c.effective}` + (c.effective !== c.configured ? ` (of ${c.configured})` : '');
    return el('td', { class: 'cap' }, meter, ' ', text);
  }

  function renderNodes(nodes) {
    const body = el('tbody');
    for (const n of nodes) {
      const state = n.state || (n.ready ? 'ready' : n.connected ? 'registered' : 'offline');
      const badge = el('span', { class: 'badge state-' + state, 'data-role': 'state' }, state);
      const detail = el('td', {}, n.connected
        ? `generation ${n.generation}, core ${n.worker === null ? '—' : n.worker}`
        : 'no connection');
      for (const l of n.links || []) {
        const kind = l.suspect ? 'suspect' : l.ready ? 'ready' : 'pending';
        detail.append(' ', el('span', { class: 'badge small link-' + kind }, `link ${l.index} ${kind}`));
      }
      body.append(el('tr', { class: 'node', 'data-node': n.id, 'data-state': state },
        el('td', { class: 'id' }, n.id),
        el('td', {}, badge, n.suspect ? el('span', { class: 'badge suspect' }, 'suspect') : null),
        detail,
        el('td', {}), el('td', {}), el('td', {}), el('td', {})));
      for (const p of n.providers || []) {
        const health = p.health + (p.runtime_health !== 'healthy' ? `, ${p.runtime_health}` : '') +
          (p.suspect ? ', suspect' : '');
        body.append(el('tr', { class: 'provider', 'data-node': n.id, 'data-provider': p.id, 'data-status': p.status },
          el('td', { class: 'id' }, '└ ' + p.id),
          el('td', {}, el('span', { class: 'badge status-' + p.status }, p.status)),
          el('td', {}, health),
          capacityCell(p.normal),
          capacityCell(p.long),
          el('td', { class: 'num', 'data-role': 'leases' }, count(p.leases_in_use)),
          el('td', { class: 'num' }, count(p.waiters))));
      }
    }
    $('nodes').tBodies[0].replaceWith(body);
  }

  function renderModels(models) {
    const first = history[0];
    const last = history[history.length - 1];
    const dt = last && first ? (last.ts - first.ts) / 1000 : 0;
    const body = el('tbody');
    for (const m of models) {
      const now = last.models.get(m.name);
      const base = first.models.get(m.name) || now;
      let rate = '—';
      let p50 = null;
      let p95 = null;
      if (dt * 1000 >= RATE_MIN_MS) {
        rate = ((now.total - base.total) / dt).toFixed(2);
        const delta = now.ttft.buckets.map((c, i) => c - (base.ttft.buckets[i] || 0));
        p50 = quantile(0.5, delta);
        p95 = quantile(0.95, delta);
      }
      const avg = now.ttft.count > 0 ? now.ttft.sum_seconds / now.ttft.count : null;
      const targets = (m.targets || []).map((t) => `${t.node}/${t.provider}`).join(', ');
      const u = m.usage || {};
      body.append(el('tr', { 'data-model': m.name },
        el('td', { class: 'id' }, m.name),
        el('td', { class: 'muted' }, targets),
        el('td', { class: 'num' }, `${count(m.waiters)} / ${count(m.max_waiters)}`),
        el('td', { class: 'num', 'data-role': 'requests' }, count(now.total)),
        el('td', { class: 'num', 'data-role': 'rate' }, rate),
        el('td', { class: 'num' + (now.notOk > 0 ? ' warn' : '') }, count(now.notOk)),
        el('td', { class: 'num' }, seconds(p50)),
        el('td', { class: 'num' }, seconds(p95)),
        el('td', { class: 'num' }, seconds(avg)),
        el('td', { class: 'num' }, `${count(u.input_tokens)} / ${count(u.output_tokens)}`)));
    }
    $('models').tBodies[0].replaceWith(body);
  }

  // ---- events ------------------------------------------------------------

  function describe(e) {
    switch (e.type) {
      case 'node_registered':
        return `${e.node} registered a connection from ${e.peer} (generation ${e.generation})`;
      case 'registration_refused':
        return `registration refused: ${e.refusal}` + (e.node ? ` (${e.node})` : '') + ` from ${e.peer}`;
      case 'node_ready':
        return `${e.node} ready (generation ${e.generation})`;
      case 'node_draining':
        return `${e.node} draining (generation ${e.generation})`;
      case 'node_disconnected':
        return `${e.node} link ${e.link} ended: ${e.reason}` + (e.current ? ', node offline' : ', other links go on');
      case 'link_suspect':
        return `${e.node} link ${e.link} suspect (silent ${e.silent_ms} ms)`;
      case 'link_responsive':
        return `${e.node} link ${e.link} responsive again (after ${e.suspect_ms} ms)`;
      case 'run_terminal':
        return `${e.model} on ${e.node}: ${e.outcome}` + (e.code ? ` (${e.code})` : '') + `, ${e.path}`;
      case 'provider_health':
        return `${e.node}/${e.provider} ${e.source}: ${e.health}, ${e.outcome} (now ${e.overlay})`;
      case 'config_reloaded':
        return `config revision ${e.revision} applied`;
      case 'config_rejected':
        return `config rejected: ${e.error}`;
      case 'lagged':
        return `${e.dropped} events lost (the page fell behind)`;
      default: {
        const rest = Object.assign({}, e);
        delete rest.type;
        delete rest.ts_ms;
        return JSON.stringify(rest);
      }
    }
  }

  function onEvent(e) {
    const item = { ts: e.ts_ms || Date.now(), type: String(e.type), text: describe(e) };
    allEvents.unshift(item);
    if (allEvents.length > MAX_EVENTS) allEvents.pop();
    if (e.type !== 'run_terminal') {
      lifecycle.unshift(item);
      if (lifecycle.length > MAX_EVENTS) lifecycle.pop();
    }
    renderEvents();
  }

  function renderEvents() {
    const list = $('show-runs').checked ? allEvents : lifecycle;
    const ol = el('ol', { id: 'events' });
    for (const it of list) {
      ol.append(el('li', { 'data-type': it.type },
        el('time', {}, clock(it.ts)), ' ',
        el('span', { class: 'badge small ev' }, it.type), ' ',
        it.text));
    }
    if (list.length === 0) ol.append(el('li', { class: 'muted' }, 'none since the page connected'));
    $('events').replaceWith(ol);
  }

  // A stream that stays open but brings no snapshot is shown as such.
  setInterval(() => {
    if (live && lastSnapshotAt > 0 && Date.now() - lastSnapshotAt > STALE_MS) {
      setConn('wait', `stale: no update for ${Math.round((Date.now() - lastSnapshotAt) / 1000)} s`);
    }
  }, 1000);

  renderEvents();
  if (token) start();
  else showLogin('');
})();
