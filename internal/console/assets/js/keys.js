// API keys (admin): create (the secret shown once), revoke, quotas, and
// each key's live sandboxes and the memory they hold.
import { get, post, call, query } from './api.js';
import { h, field, fmtBytes, when, say, errText, confirm, table } from './ui.js';

export async function keysPage(main, signal) {
  const box = h('div');
  const secret = h('div', { 'aria-live': 'polite' });
  const name = h('input', { type: 'text', name: 'name', required: true, maxlength: 128 });
  const admin = h('input', { type: 'checkbox', name: 'admin' });
  const maxSb = h('input', { type: 'number', name: 'max_sandboxes', min: 0, placeholder: 'server default' });
  const maxMem = h('input', { type: 'number', name: 'max_memory_gib', min: 0, step: 'any', placeholder: 'server default' });
  const form = h('form', { class: 'card create' }, field('Name', name), field('Max sandboxes', maxSb), field('Max memory (GiB)', maxMem),
    h('div', { class: 'field check' }, admin, h('label', { for: admin.id = 'f-admin', text: 'Admin key' })),
    h('button', { type: 'submit', class: 'primary', text: 'Create key' }));
  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    try {
      const k = await post('/v1/keys', { name: name.value.trim(), admin: admin.checked,
        max_sandboxes: Number(maxSb.value) || undefined, max_memory_bytes: Math.round(Number(maxMem.value) * 1073741824) || undefined });
      const out = h('input', { type: 'text', readonly: true, value: k.secret, class: 'secret', id: 'new-secret' });
      secret.replaceChildren(h('div', { class: 'card' }, h('p', {}, h('strong', { text: `Key ${k.name} created.` }),
        ' Copy its secret now: it is not shown again.'), field('Secret', out)));
      out.select();
      form.reset();
      load();
    } catch (err) {
      say(errText(err), true);
    }
  });
  main.append(h('h1', { text: 'API keys' }), form, secret, box);
  async function load() {
    try {
      const [keys, sbs] = await Promise.all([get('/v1/keys', { signal }),
        get('/v1/sandboxes' + query({ owner: '*', state: ['creating', 'running', 'paused'], limit: 1000 }), { signal })]);
      const use = {};
      for (const s of sbs.sandboxes) {
        const u = use[s.owner] ||= { n: 0, mem: 0 };
        u.n++;
        u.mem += s.limits?.memory_bytes || 0;
      }
      box.replaceChildren(table('API keys', ['Key', 'Name', 'Prefix', 'Admin', 'Created', 'Quota', 'Live sandboxes', 'Memory held', ''],
        keys.map((k) => {
          const u = use[k.id] || { n: 0, mem: 0 };
          return h('tr', { class: k.revoked_at ? 'revoked' : null }, h('th', { scope: 'row', text: k.id }), h('td', { text: k.name }),
            h('td', {}, h('code', { text: k.prefix })), h('td', { text: k.admin ? 'yes' : '' }), h('td', { text: when(k.created_at) }),
            h('td', { text: `${k.max_sandboxes || 'default'} sandboxes, ${k.max_memory_bytes ? fmtBytes(k.max_memory_bytes) : 'default'} memory` }),
            h('td', {}, h('a', { href: '#/sandboxes?owner=' + encodeURIComponent(k.id), text: String(u.n) })),
            h('td', { text: fmtBytes(u.mem) }),
            h('td', {}, k.revoked_at ? 'revoked ' + when(k.revoked_at) : h('button', { type: 'button', class: 'danger', text: 'Revoke',
              'aria-label': 'Revoke ' + k.name, onclick: async () => {
                if (!await confirm(`Revoke key ${k.name} (${k.id})? Its clients get 401 at once.`, 'Revoke')) return;
                try { await call('DELETE', '/v1/keys/' + encodeURIComponent(k.id)); say('Revoked ' + k.name); load(); } catch (e) { say(errText(e), true); }
              } })));
        })));
    } catch (e) {
      if (e.name !== 'AbortError') say(errText(e), true);
    }
  }
  await load();
}
