// Templates, their builds (status, a live log with step progress, a new
// build from a Dockerfile) and snapshots.
import { get, post, call, query, events } from './api.js';
import { h, field, fmtBytes, ago, when, badge, say, errText, confirm, table, empty } from './ui.js';
import { compileDockerfile } from './dockerfile.js';

export async function templatesPage(main, signal) {
  const tList = h('div'), bList = h('div');
  main.append(h('h1', { text: 'Templates' }), tList, h('h2', { text: 'Start a build' }), buildForm(signal),
    h('h2', { text: 'Builds' }), bList);
  let names = new Set(['base', 'code-interpreter']);
  const load = async () => {
    try {
      const [ts, bs] = await Promise.all([get('/v1/templates', { signal }), get('/v1/templates/builds?limit=50', { signal })]);
      names = new Set(ts.templates.map((t) => t.name));
      buildForm.names = names;
      tList.replaceChildren(ts.templates.length ? table('Templates', ['Template', 'Build', 'Status', 'Owner', 'Public', 'Updated'],
        ts.templates.map((t) => h('tr', {},
          h('th', { scope: 'row', text: t.tag === 'default' ? t.name : t.name + ':' + t.tag }),
          h('td', {}, t.builtin ? 'built-in' : t.build_id ? h('a', { href: '#/templates/builds/' + t.build_id, text: t.build_id }) : ''),
          h('td', {}, t.build ? badge(t.build.status, t.build.reason) : badge('ready')),
          h('td', { text: t.owner || '' }), h('td', { text: t.public ? 'yes' : 'no' }), h('td', { text: ago(t.updated_at) }))))
        : empty('No templates.'));
      bList.replaceChildren(bs.builds.length ? table('Builds', ['Build', 'Template', 'Status', 'Steps', 'Cached', 'Started'],
        bs.builds.map((b) => h('tr', {},
          h('th', { scope: 'row' }, h('a', { href: '#/templates/builds/' + b.id, text: b.id })),
          h('td', { text: b.template + (b.tag ? ':' + b.tag : '') }), h('td', {}, badge(b.status, b.reason)),
          h('td', { text: b.status === 'building' ? `${b.steps} steps` : `${b.steps_done}/${b.steps}` }),
          h('td', { text: String(b.cached_steps) }), h('td', { text: ago(b.created_at) }))))
        : empty('No builds yet.'));
    } catch (e) {
      if (e.name !== 'AbortError') say(errText(e), true);
    }
  };
  await load();
  const t = setInterval(load, 3000);
  signal.addEventListener('abort', () => clearInterval(t));
}

// buildForm starts a build from an uploaded (or typed) Dockerfile.
function buildForm() {
  const name = h('input', { type: 'text', name: 'template', required: true, placeholder: 'myapp:v1', pattern: '[a-z0-9._-]+(:[a-z0-9._-]+)?' });
  const file = h('input', { type: 'file', name: 'dockerfile', accept: '.dockerfile,text/plain,*' });
  const text = h('textarea', { name: 'dockerfile-text', rows: 6, spellcheck: 'false', placeholder: 'FROM base\nRUN apt-get install -y cowsay' });
  const err = h('p', { class: 'error', role: 'alert' });
  file.addEventListener('change', async () => { if (file.files[0]) text.value = await file.files[0].text(); });
  const form = h('form', { class: 'card' }, field('Template name', name), field('Dockerfile file', file),
    field('Dockerfile', text, 'FROM a template (base, code-interpreter, yours) or an image; RUN, ENV, WORKDIR, USER, CMD. COPY/ADD need the CLI.'),
    err, h('button', { type: 'submit', class: 'primary', text: 'Build' }));
  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    err.textContent = '';
    try {
      const spec = compileDockerfile(text.value, (n) => (buildForm.names || new Set(['base', 'code-interpreter'])).has(n));
      const b = await post('/v1/templates/builds', { template: name.value.trim(), spec });
      location.hash = '#/templates/builds/' + b.id;
    } catch (ex) {
      err.textContent = errText(ex);
    }
  });
  return form;
}

// buildPage follows one build's log, with a progress bar from the log's
// stage, total and event fields.
export async function buildPage(main, id, signal) {
  const status = h('span');
  const progress = h('progress', { max: 1, value: 0, 'aria-label': 'Build progress' });
  const stepText = h('span', { class: 'muted', id: 'step-text', 'aria-live': 'polite' });
  const log = h('pre', { class: 'log', id: 'build-log', tabindex: '0', 'aria-label': 'Build log' });
  const reason = h('div');
  main.append(h('div', { class: 'head' }, h('h1', {}, 'Build ', h('code', { text: id })), status),
    h('p', {}, progress, ' ', stepText), reason, log, h('p', {}, h('a', { href: '#/templates', text: 'All templates' })));
  const show = (b) => {
    status.replaceChildren(badge(b.status, b.reason), ' ', b.template + (b.tag ? ':' + b.tag : ''));
    reason.replaceChildren(b.reason ? h('pre', { class: 'traceback', role: 'alert', text: b.reason }) : '');
    if (b.steps) progress.max = b.steps;
    if (b.status === 'ready') progress.value = progress.max;
  };
  try { show(await get('/v1/templates/builds/' + encodeURIComponent(id), { signal })); } catch (e) { say(errText(e), true); return; }
  try {
    const res = await call('GET', '/v1/templates/builds/' + encodeURIComponent(id) + '/logs' + query({ follow: 'true' }), { raw: true, signal });
    await events(res, (en) => {
      if (en.type === 'ping') return;
      if (en.type === 'error' && en.error) { log.append(en.error.message + '\n'); return; }
      const atEnd = log.scrollTop + log.clientHeight >= log.scrollHeight - 20;
      log.append(h('span', { class: en.level === 'error' ? 'stderr' : en.output ? 'out' : 'meta', text: en.message + '\n' }));
      if (atEnd) log.scrollTop = log.scrollHeight;
      if (en.stage === 'step' && en.total) progress.max = en.total;
      // Steps before the one that begins are done; a done (or cached) step
      // counts itself. ENV, WORKDIR and USER log only their begin.
      if (en.stage === 'step' && en.event === 'begin') progress.value = en.step + (en.cached ? 1 : 0);
      if (en.stage === 'step' && en.event === 'done') progress.value = en.step + 1;
      if (en.stage === 'step' && en.event === 'begin') stepText.textContent = `step ${en.step + 1} of ${en.total}`;
      if (en.event === 'ready') { progress.value = progress.max; stepText.textContent = 'ready'; }
      if (en.event === 'error') stepText.textContent = 'failed';
    });
  } catch (e) {
    if (e.name !== 'AbortError') say(errText(e), true);
  }
  try { show(await get('/v1/templates/builds/' + encodeURIComponent(id), { signal })); } catch { /* gone */ }
}

export async function snapshotsPage(main, signal) {
  const box = h('div');
  main.append(h('h1', { text: 'Snapshots' }), box);
  const load = async () => {
    try {
      const l = await get('/v1/snapshots', { signal });
      box.replaceChildren(h('p', { class: 'muted', text: `${l.snapshots.length} snapshots, ${fmtBytes(l.total_bytes)} in all` }),
        l.snapshots.length ? table('Snapshots', ['Name', 'Source', 'Template', 'Runtime', 'Size', 'Taken', ''],
          l.snapshots.map((s) => h('tr', {}, h('th', { scope: 'row', text: s.name }),
            h('td', {}, h('a', { href: '#/sandboxes/' + s.source, text: s.source })), h('td', { text: s.template }),
            h('td', { text: s.runtime }), h('td', { text: fmtBytes(s.size_bytes) }), h('td', { text: when(s.created_at) }),
            h('td', { class: 'actions' },
              h('button', { type: 'button', text: 'Start sandbox', onclick: async () => {
                try { const sb = await post('/v1/sandboxes', { snapshot: s.name }); location.hash = '#/sandboxes/' + sb.id; } catch (e) { say(errText(e), true); }
              } }),
              h('button', { type: 'button', class: 'danger', text: 'Delete', onclick: async () => {
                if (!await confirm(`Delete snapshot ${s.name}?`, 'Delete')) return;
                try { await call('DELETE', '/v1/snapshots/' + encodeURIComponent(s.name)); load(); } catch (e) { say(errText(e), true); }
              } })))))
          : empty('No snapshots. Take one from a running runsc sandbox\'s page.'));
    } catch (e) {
      if (e.name !== 'AbortError') say(errText(e), true);
    }
  };
  await load();
}
