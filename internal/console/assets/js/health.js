// Server health: GET /healthz (status, version), GET /v1/node for admin
// keys (runtimes, capacity, what live sandboxes hold, pools) and what GET
// /metrics exposes (creates, commands, snapshots, builds), refreshed every
// few seconds.
import { auth, get, call } from './api.js';
import { h, fmtBytes, say, errText, table, download, empty } from './ui.js';

// parseMetrics reads Prometheus' text format into [{name, labels, value}].
export function parseMetrics(text) {
  const out = [];
  for (const line of text.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const m = line.match(/^([a-zA-Z_:][\w:]*)(?:\{(.*)\})?\s+(\S+)/);
    if (!m) continue;
    const labels = {};
    for (const [, k, v] of (m[2] || '').matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g)) labels[k] = v.replace(/\\(.)/g, '$1');
    out.push({ name: m[1], labels, value: Number(m[3]) });
  }
  return out;
}

// meter shows used of total as a bar with words.
function meter(used, total, label, fmt) {
  return h('span', { class: 'meter' }, h('meter', { min: 0, max: total || 1, value: used, 'aria-label': label }),
    ` ${fmt(used)} of ${fmt(total)}`);
}

export async function healthPage(main, signal) {
  const box = h('div');
  main.append(h('div', { class: 'head' }, h('h1', { text: 'Server health' }),
    h('button', { type: 'button', text: 'Download /metrics', onclick: async () => {
      try { download(await (await call('GET', '/metrics', { raw: true })).blob(), 'kiln-metrics.txt'); } catch (e) { say(errText(e), true); }
    } })), box);
  const load = async () => {
    try {
      const hz = await (await fetch('/healthz', { cache: 'no-store', signal })).json();
      let ms = [];
      try { ms = parseMetrics(await (await call('GET', '/metrics', { raw: true, signal })).text()); } catch (e) { if (e.status !== 404) throw e; }
      const node = auth.admin() ? await get('/v1/node', { signal }) : null;
      const pick = (name) => ms.filter((m) => m.name === name);
      const one = (name) => pick(name).reduce((a, m) => a + m.value, 0);
      const states = pick('kiln_sandboxes');
      const pools = {};
      for (const m of ms.filter((m) => m.name.startsWith('kiln_pool_'))) (pools[m.labels.template] ||= {})[m.name.slice(10)] = m.value;
      for (const p of node?.pools || []) pools[p.template] = { size: p.ready, target: p.target, hits_total: p.hits, misses_total: p.misses };
      const cap = node ? [
        h('dt', { text: 'Runtimes' }), h('dd', { text: node.runtimes.map((r) => r === node.default_runtime ? r + ' (default)' : r).join(', ') + (node.network ? ' · networking on' : ' · networking off') }),
        h('dt', { text: 'CPU' }), h('dd', {}, meter(node.allocated.cpus || 0, node.cpus, 'CPU limits of live sandboxes', (v) => v.toFixed(v % 1 ? 1 : 0) + ' CPUs')),
        h('dt', { text: 'Memory' }), h('dd', {}, meter(node.allocated.memory_bytes || 0, node.memory_bytes, 'memory limits of live sandboxes', fmtBytes),
          h('small', { class: 'muted', text: ` · ${fmtBytes(node.memory_available_bytes)} available now` })),
        h('dt', { text: 'Disk' }), h('dd', {}, meter(node.disk_bytes - node.disk_free_bytes, node.disk_bytes, 'data dir disk used', fmtBytes),
          h('small', { class: 'muted', text: ` · sandbox disk limits ${fmtBytes(node.allocated.disk_bytes || 0)}` })),
      ] : [];
      const creates = one('kiln_sandbox_create_seconds_count');
      const builds = pick('kiln_template_builds_total');
      const dl = h('dl', { class: 'facts' },
        h('dt', { text: 'Status' }), h('dd', { text: hz.status }),
        h('dt', { text: 'Version' }), h('dd', {}, h('code', { text: hz.version || '' })),
        ...cap,
        h('dt', { text: 'Sandboxes' }), h('dd', { text: node ? Object.entries(node.sandboxes).map(([k, v]) => `${v} ${k}`).join(' · ') || 'none live' : states.length ? states.map((m) => `${m.value} ${m.labels.state}`).join(' · ') : 'metrics are off' }),
        h('dt', { text: 'Creates' }), h('dd', { text: creates ? `${creates}, ${(1000 * one('kiln_sandbox_create_seconds_sum') / creates).toFixed(0)} ms on average, ${one('kiln_sandbox_create_errors_total')} failed` : 'none yet' }),
        h('dt', { text: 'Commands' }), h('dd', { text: `${one('kiln_commands_started_total')} started` }),
        h('dt', { text: 'Snapshots' }), h('dd', { text: `${one('kiln_snapshots')} (${fmtBytes(one('kiln_snapshot_bytes'))})` }),
        h('dt', { text: 'Template builds' }), h('dd', { text: builds.length ? builds.map((m) => `${m.value} ${m.labels.status}`).join(' · ') : 'none yet' }));
      const poolRows = Object.entries(pools).map(([t, p]) => {
        const tries = (p.hits_total || 0) + (p.misses_total || 0);
        return h('tr', {}, h('th', { scope: 'row', text: t }), h('td', { text: `${p.size ?? 0} / ${p.target ?? 0}` }),
          h('td', { text: tries ? (100 * (p.hits_total || 0) / tries).toFixed(0) + '%' : '' }), h('td', { text: String(tries) }));
      });
      box.replaceChildren(dl, h('h2', { text: 'Pools' }),
        poolRows.length ? table('Pools', ['Template', 'Ready / target', 'Hit rate', 'Creates'], poolRows) : empty('No pools configured.'));
    } catch (e) {
      if (e.name !== 'AbortError') say(errText(e), true);
    }
  };
  await load();
  const t = setInterval(load, 5000);
  signal.addEventListener('abort', () => clearInterval(t));
}
