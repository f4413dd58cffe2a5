// The sandbox list: polled every second, rows updated in place (so focus
// and selection survive), with CPU and memory now for running sandboxes.
import { auth, get, post, query, sbPath } from './api.js';
import { h, field, fmtBytes, ago, until, badge, say, errText } from './ui.js';

const STATES = {
  live: ['creating', 'running', 'paused', 'stopping'],
  running: ['running'], paused: ['paused'], stopped: ['stopped'], failed: ['failed'], all: [],
};

// parseMeta turns "a=1, b=2" into {"metadata.a": "1", ...}.
function parseMeta(s) {
  const out = {};
  for (const part of s.split(',')) {
    const [k, ...v] = part.split('=');
    if (k.trim()) out['metadata.' + k.trim()] = v.join('=').trim();
  }
  return out;
}

export async function sandboxList(main, params, signal) {
  const state = h('select', { name: 'state' },
    Object.keys(STATES).map((s) => h('option', { value: s, text: s === 'live' ? 'live (not ended)' : s })));
  state.value = params.get('state') || 'live';
  const tmpl = h('input', { name: 'template', type: 'search', placeholder: 'any', value: params.get('template') || '' });
  const meta = h('input', { name: 'metadata', type: 'search', placeholder: 'key=value, …', value: params.get('metadata') || '' });
  const all = h('input', { type: 'checkbox', name: 'owner', checked: params.has('owner') });
  const ownerID = params.get('owner') && params.get('owner') !== '*' ? params.get('owner') : '';
  const filters = h('form', { class: 'filters', role: 'search', 'aria-label': 'Filter sandboxes', onsubmit: (e) => e.preventDefault() },
    field('State', state), field('Template', tmpl), field('Metadata', meta),
    auth.admin() ? h('div', { class: 'field check' }, all, h('label', { for: all.id = 'f-all', text: ownerID ? 'Only key ' + ownerID : 'All keys' })) : null);
  const tbody = h('tbody');
  const count = h('p', { class: 'muted', 'aria-live': 'polite' });
  main.append(
    h('div', { class: 'head' }, h('h1', { text: 'Sandboxes' }), createForm(signal)),
    filters, count,
    h('div', { class: 'scroll' }, h('table', { class: 'list', id: 'sandboxes' },
      h('caption', { class: 'sr', text: 'Sandboxes' }),
      h('thead', {}, h('tr', {}, ['Sandbox', 'State', 'Template', 'Runtime', 'Owner', 'Age', 'Expires', 'CPU', 'Memory']
        .map((x) => h('th', { scope: 'col', text: x })))),
      tbody)));

  const rows = new Map(); // id -> {tr, cells}
  const cpuPrev = new Map(); // id -> [cpu_seconds, ms]
  let busy = false;
  async function poll() {
    if (busy || signal.aborted) return;
    busy = true;
    try {
      const q = { state: STATES[state.value], limit: 1000, ...parseMeta(meta.value) };
      if (all.checked) q.owner = ownerID || '*';
      const list = await get('/v1/sandboxes' + query(q), { signal });
      let sbs = list.sandboxes.filter((s) => !tmpl.value.trim() || s.template.includes(tmpl.value.trim()));
      sbs = sbs.reverse(); // newest first
      const seen = new Set();
      for (const sb of sbs) {
        seen.add(sb.id);
        let r = rows.get(sb.id);
        if (!r) {
          const cells = Array.from({ length: 9 }, () => h('td'));
          cells[0] = h('th', { scope: 'row' }, h('a', { href: '#/sandboxes/' + sb.id, text: sb.id }));
          r = { tr: h('tr', { 'data-id': sb.id }, cells), cells };
          rows.set(sb.id, r);
        }
        tbody.append(r.tr); // keeps the order
        const c = r.cells;
        c[1].replaceChildren(badge(sb.state, sb.reason), sb.reason ? h('small', { class: 'reason', text: ' ' + sb.reason }) : '');
        c[2].textContent = sb.template;
        c[3].textContent = sb.runtime;
        c[4].textContent = sb.owner || '';
        c[5].textContent = ago(sb.created_at);
        c[6].textContent = sb.state === 'running' || sb.state === 'paused' ? until(sb.expires_at) : '';
        if (sb.state !== 'running') { c[7].textContent = ''; c[8].textContent = ''; }
      }
      for (const [id, r] of rows) if (!seen.has(id)) { r.tr.remove(); rows.delete(id); cpuPrev.delete(id); }
      count.textContent = sbs.length + (sbs.length === 1 ? ' sandbox' : ' sandboxes');
      // Usage of running ones (another key's answer 404: skipped).
      await Promise.all(sbs.filter((s) => s.state === 'running').slice(0, 50).map(async (sb) => {
        try {
          const u = await get(sbPath(sb.id, '/usage'), { signal });
          const now = performance.now();
          const prev = cpuPrev.get(sb.id);
          cpuPrev.set(sb.id, [u.cpu_seconds, now]);
          const c = rows.get(sb.id)?.cells;
          if (!c) return;
          if (prev) c[7].textContent = (100 * (u.cpu_seconds - prev[0]) / ((now - prev[1]) / 1000)).toFixed(0) + '%';
          c[8].textContent = fmtBytes(u.memory_bytes) + ' / ' + fmtBytes(u.memory_limit);
        } catch { /* ended or not ours */ }
      }));
    } catch (e) {
      if (e.name !== 'AbortError') say(errText(e), true);
    } finally {
      busy = false;
    }
  }
  for (const el of [state, tmpl, meta, all]) el.addEventListener('input', () => { rows.clear(); tbody.replaceChildren(); poll(); });
  await poll();
  const t = setInterval(poll, 1000);
  signal.addEventListener('abort', () => clearInterval(t));
}

// createForm starts a sandbox from a template.
function createForm(signal) {
  const tmpl = h('select', { name: 'template' }, h('option', { value: 'base', text: 'base' }));
  get('/v1/templates', { signal }).then((l) => {
    tmpl.replaceChildren(...l.templates.map((t) => {
      const ref = t.tag === 'default' ? t.name : t.name + ':' + t.tag;
      return h('option', { value: ref, text: ref });
    }));
  }).catch(() => {});
  const runtime = h('select', { name: 'runtime' }, h('option', { value: '', text: 'default' }),
    h('option', { value: 'runsc', text: 'runsc (gVisor)' }), h('option', { value: 'runc', text: 'runc' }));
  const timeout = h('input', { type: 'number', name: 'timeout', min: 1, max: 86400, value: 600 });
  const form = h('form', { class: 'create' },
    field('Template', tmpl), field('Runtime', runtime), field('Timeout (s)', timeout),
    h('button', { type: 'submit', class: 'primary', text: 'Create' }));
  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    const btn = form.querySelector('button');
    btn.disabled = true;
    say('Creating a sandbox…');
    try {
      const sb = await post('/v1/sandboxes', { template: tmpl.value, runtime: runtime.value || undefined, timeout: Number(timeout.value) });
      say('Created ' + sb.id);
      location.hash = '#/sandboxes/' + sb.id;
    } catch (err) {
      say(errText(err), true);
    } finally {
      btn.disabled = false;
    }
  });
  return h('details', { class: 'new' }, h('summary', { text: 'New sandbox' }), form);
}
