// One sandbox: its record, actions and four tabs (overview with live
// usage and processes, terminal, files, code).
import { auth, get, post, call, sbPath } from './api.js';
import { h, field, fmtBytes, ago, until, when, badge, say, errText, confirm, table, empty } from './ui.js';
import { terminalTab } from './terminal.js';
import { filesTab } from './files.js';
import { codeTab } from './code.js';

const TABS = [['overview', 'Overview'], ['terminal', 'Terminal'], ['files', 'Files'], ['code', 'Code']];

export async function sandboxPage(main, id, tab, signal) {
  let sb;
  try {
    sb = await get(sbPath(id), { signal });
  } catch (e) {
    const note = e.code === 'not_found' && auth.admin()
      ? ' An admin key lists every key\'s sandboxes but opens only its own: use the key that created it.' : '';
    main.append(h('h1', { text: 'Sandbox ' + id }), h('p', { class: 'error', role: 'alert', text: errText(e) + note }),
      h('p', {}, h('a', { href: '#/sandboxes', text: 'Back to the list' })));
    return;
  }
  const state = h('span');
  const expires = h('span', { class: 'muted' });
  const reason = h('div', { role: 'alert' });
  const actions = h('div', { class: 'actions', role: 'group', 'aria-label': 'Sandbox actions' });
  const show = (s) => {
    sb = s;
    state.replaceChildren(badge(s.state, s.reason));
    expires.textContent = s.state === 'running' || s.state === 'paused' ? ' · expires ' + until(s.expires_at) : '';
    reason.replaceChildren(s.reason && s.state !== 'running'
      ? h('p', { class: s.state === 'failed' ? 'error' : 'muted', text: (s.state === 'failed' ? 'Failed: ' : 'Ended: ') + s.reason }) : '');
    for (const b of actions.querySelectorAll('[data-when]')) b.disabled = !b.dataset.when.split(' ').includes(s.state);
  };
  const act = (label, when, f, cls) => h('button', { type: 'button', class: cls || null, 'data-when': when, text: label, onclick: async (e) => {
    e.target.disabled = true;
    try { await f(); } catch (err) { say(errText(err), true); } finally { show(sb); }
  } });
  const secs = h('input', { type: 'number', min: 1, max: 86400, value: 600, 'aria-label': 'New timeout in seconds', class: 'short' });
  const snapName = h('input', { type: 'text', placeholder: 'snapshot name', 'aria-label': 'Snapshot name', class: 'short' });
  actions.append(
    h('span', { class: 'inline' }, secs, act('Set timeout', 'running', async () => {
      show(await post(sbPath(id, '/timeout'), { timeout: Number(secs.value) }));
      say('Timeout set.');
    })),
    act('Pause', 'running', async () => { say('Pausing…'); show(await post(sbPath(id, '/pause'))); say('Paused.'); }),
    act('Resume', 'paused', async () => { say('Resuming…'); show(await post(sbPath(id, '/resume'))); say('Resumed.'); }),
    act('Fork', 'running', async () => {
      const r = await post(sbPath(id, '/fork'), { count: 1 });
      say('Forked: ' + r.sandboxes.map((s) => s.id).join(', '));
    }),
    h('span', { class: 'inline' }, snapName, act('Snapshot', 'running', async () => {
      const s = await post(sbPath(id, '/snapshots'), { name: snapName.value.trim() });
      say('Snapshot ' + s.name + ' taken (' + fmtBytes(s.size_bytes) + ').');
    })),
    act('Kill', 'creating running paused', async () => {
      if (!await confirm(`Kill sandbox ${id} and everything in it?`, 'Kill')) return;
      await call('DELETE', sbPath(id));
      say('Killed ' + id + '.');
      show(await get(sbPath(id)));
    }, 'danger'));

  const tablist = h('div', { role: 'tablist', 'aria-label': 'Sandbox views', class: 'tabs' },
    TABS.map(([t, label]) => h('a', { role: 'tab', href: `#/sandboxes/${id}/${t}`, id: 'tab-' + t,
      'aria-selected': String(t === tab), tabindex: t === tab ? '0' : '-1', text: label })));
  tablist.addEventListener('keydown', (e) => { // arrow keys move between tabs
    const i = TABS.findIndex(([t]) => t === tab);
    const j = e.key === 'ArrowRight' ? i + 1 : e.key === 'ArrowLeft' ? i - 1 : -1;
    if (j >= 0 && j < TABS.length) { location.hash = `#/sandboxes/${id}/${TABS[j][0]}`; }
  });
  const panel = h('section', { role: 'tabpanel', 'aria-labelledby': 'tab-' + tab, class: 'panel' });
  main.append(h('div', { class: 'head' }, h('h1', {}, 'Sandbox ', h('code', { text: id })), state, expires), reason, actions, tablist, panel);
  show(sb);
  const t = setInterval(async () => {
    try { show(await get(sbPath(id), { signal })); } catch { /* shown by the next call */ }
  }, 1000);
  signal.addEventListener('abort', () => clearInterval(t));
  const live = () => sb.state === 'running' || (sb.state === 'paused' && sb.auto_pause);
  if (tab !== 'overview' && !live()) {
    panel.append(empty(`The sandbox is ${sb.state}: ${tab} needs a running sandbox.`));
    return;
  }
  const views = { overview: overviewTab, terminal: terminalTab, files: filesTab, code: codeTab };
  await (views[tab] || overviewTab)(panel, () => sb, signal);
}

// overviewTab: the record, network policy, a live CPU and memory chart,
// and the sandbox's processes.
async function overviewTab(panel, current, signal) {
  const sb = current();
  const l = sb.limits || {};
  const dl = h('dl', { class: 'facts' });
  const fact = (k, v) => dl.append(h('dt', { text: k }), h('dd', {}, v));
  fact('Template', sb.template);
  fact('Runtime', sb.runtime);
  if (sb.owner) fact('Owner', sb.owner);
  fact('Created', when(sb.created_at) + ' (' + ago(sb.created_at) + ')');
  fact('Limits', `${l.cpus || '?'} CPU · ${fmtBytes(l.memory_bytes)} memory · ${fmtBytes(l.disk_bytes)} disk · ${l.pids || '?'} pids`);
  if (sb.auto_pause) fact('Auto-pause', 'yes');
  const meta = Object.entries(sb.metadata || {});
  fact('Metadata', meta.length ? h('ul', { class: 'kv' }, meta.map(([k, v]) => h('li', {}, h('code', { text: k }), ' = ', h('code', { text: v })))) : 'none');
  if (sb.volumes) fact('Volumes', sb.volumes.map((v) => `${v.volume} at ${v.path}${v.read_only ? ' (read-only)' : ''}`).join(', '));
  const net = h('dd', { text: '…' });
  dl.append(h('dt', { text: 'Network' }), net);
  const chartBox = h('div', { class: 'chart', role: 'img', 'aria-label': 'CPU and memory use over the last two minutes' });
  const now = h('p', { class: 'muted', 'aria-live': 'off' });
  const procs = h('div');
  panel.append(dl, h('h2', { text: 'CPU and memory' }), now, chartBox, h('h2', { text: 'Processes' }), procs);

  get(sbPath(sb.id, '/network'), { signal }).then((n) => {
    const parts = ['mode ' + n.mode];
    if (n.egress) parts.push('egress ' + n.egress);
    if (n.allow?.length) parts.push('allow ' + n.allow.join(', '));
    if (n.deny?.length) parts.push('deny ' + n.deny.join(', '));
    if (n.address) parts.push('address ' + n.address);
    if (n.public) parts.push('public ports');
    net.textContent = parts.join(' · ');
  }).catch((e) => { net.textContent = errText(e); });

  if (sb.state !== 'running') { now.textContent = 'No usage: the sandbox is ' + sb.state + '.'; return; }
  const xs = [], cpu = [], mem = [];
  let prev = null, plot = null;
  const draw = () => {
    const width = Math.max(280, chartBox.clientWidth || 600);
    if (!plot && window.uPlot) {
      plot = new window.uPlot({
        width, height: 220,
        scales: {
          x: { time: true, range: (u, min, max) => [max - 120, max] }, // the last two minutes
          '%': { range: (u, min, max) => [0, Math.max(5, max * 1.2)] },
          MiB: { range: (u, min, max) => [0, Math.max(16, max * 1.2)] },
        },
        series: [{}, { label: 'CPU %', stroke: '#d9480f', scale: '%' }, { label: 'Memory MiB', stroke: '#1c7ed6', scale: 'MiB' }],
        axes: [{}, { scale: '%', label: 'CPU %' }, { scale: 'MiB', side: 1, label: 'MiB', grid: { show: false } }],
      }, [xs, cpu, mem], chartBox);
    } else if (plot) {
      plot.setData([xs, cpu, mem]);
      if (Math.abs(plot.width - width) > 4) plot.setSize({ width, height: 220 });
    }
  };
  let busy = false;
  const poll = async () => {
    if (busy) return; // a slow answer: skip a tick rather than overlap
    busy = true;
    try {
      const u = await get(sbPath(sb.id, '/usage'), { signal });
      const t = Date.now() / 1000;
      if (prev) {
        xs.push(t); cpu.push(100 * (u.cpu_seconds - prev[0]) / (t - prev[1])); mem.push(u.memory_bytes / 1048576);
        if (xs.length > 120) { xs.shift(); cpu.shift(); mem.shift(); }
        if (xs.length > 1) draw();
        now.textContent = `CPU ${cpu[cpu.length - 1].toFixed(0)}% · memory ${fmtBytes(u.memory_bytes)} of ${fmtBytes(u.memory_limit)} · disk ${fmtBytes(u.disk_bytes)} of ${fmtBytes(u.disk_limit)} · ${u.pids} pids`;
      }
      prev = [u.cpu_seconds, t];
    } catch { /* the sandbox ended; the header says so */ } finally { busy = false; }
  };
  const pollProcs = async () => {
    try {
      const ps = await get(sbPath(sb.id, '/commands'), { signal });
      procs.replaceChildren(ps.length ? table('Processes', ['PID', 'Tag', 'Command', 'User', 'Started', 'Exit'], ps.slice(-50).reverse().map((p) =>
        h('tr', {}, h('td', { text: p.pid }), h('td', { text: p.tag || '' }), h('td', {}, h('code', { text: (p.args || []).join(' ') })),
          h('td', { text: p.user || '' }), h('td', { text: ago(p.started_at) }),
          h('td', { text: p.exit ? String(p.exit.code) + (p.exit.reason ? ' (' + p.exit.reason + ')' : '') : 'running' })))) : empty('No commands yet.'));
    } catch { /* as above */ }
  };
  await Promise.all([poll(), pollProcs()]);
  const t1 = setInterval(poll, 1000);
  const t2 = setInterval(pollProcs, 3000);
  signal.addEventListener('abort', () => { clearInterval(t1); clearInterval(t2); });
}
