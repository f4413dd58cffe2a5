// The console's shell: sign-in, navigation and the hash router. Each view
// is a function (main, params, signal) that fills main and stops its
// polling and streams when signal aborts (the user went elsewhere).
import { auth, get, onUnauthenticated, APIError } from './js/api.js';
import { h, field, say } from './js/ui.js';
import { sandboxList } from './js/sandboxes.js';
import { sandboxPage } from './js/sandbox.js';
import { templatesPage, buildPage, snapshotsPage } from './js/templates.js';
import { keysPage } from './js/keys.js';
import { healthPage } from './js/health.js';

const main = document.getElementById('main');
let current = null; // the view's AbortController

const routes = [
  [/^\/sandboxes\/([a-z0-9]+)(?:\/(\w+))?$/, (m, q, s) => sandboxPage(main, m[1], m[2] || 'overview', s)],
  [/^\/sandboxes$/, (m, q, s) => sandboxList(main, q, s)],
  [/^\/templates\/builds\/([A-Za-z0-9_-]+)$/, (m, q, s) => buildPage(main, m[1], s)],
  [/^\/templates$/, (m, q, s) => templatesPage(main, s)],
  [/^\/snapshots$/, (m, q, s) => snapshotsPage(main, s)],
  [/^\/keys$/, (m, q, s) => keysPage(main, s)],
  [/^\/health$/, (m, q, s) => healthPage(main, s)],
];

function route() {
  if (current) current.abort();
  current = new AbortController();
  main.replaceChildren();
  if (!auth.key()) return signIn();
  document.getElementById('top').hidden = false;
  document.getElementById('nav-keys').hidden = !auth.admin();
  document.getElementById('who').textContent = auth.admin() ? 'admin key' : 'key';
  const [path, qs] = (location.hash.slice(1) || '/sandboxes').split('?');
  const params = new URLSearchParams(qs || '');
  const section = path.split('/')[1];
  for (const a of document.querySelectorAll('[data-nav]')) {
    if (a.dataset.nav === section) a.setAttribute('aria-current', 'page');
    else a.removeAttribute('aria-current');
  }
  for (const [re, view] of routes) {
    const m = path.match(re);
    if (m) {
      Promise.resolve(view(m, params, current.signal)).catch((e) => {
        if (e.name !== 'AbortError') say(e.message, true);
      });
      return;
    }
  }
  main.append(h('h1', { text: 'Not found' }), h('p', {}, h('a', { href: '#/sandboxes', text: 'Sandboxes' })));
}

// signIn asks for an API key and checks it against the API before keeping
// it: a refused key is said so and not stored.
function signIn(message) {
  document.getElementById('top').hidden = true;
  const input = h('input', { type: 'password', name: 'key', autocomplete: 'off', spellcheck: 'false', required: true, placeholder: 'e2b_…' });
  const err = h('p', { class: 'error', role: 'alert', id: 'signin-error', text: message || '' });
  const form = h('form', { class: 'card signin', 'aria-labelledby': 'signin-title' },
    h('h1', { id: 'signin-title', text: 'Sign in to Kiln' }),
    h('p', { class: 'muted', text: 'Use an API key (kiln keys create, or the admin key kiln serve printed on its first start). It is kept in this tab only.' }),
    field('API key', input), err,
    h('button', { type: 'submit', class: 'primary', text: 'Sign in' }));
  form.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    const key = input.value.trim();
    err.textContent = '';
    try {
      await get('/v1/sandboxes?limit=1', { key });
    } catch (e) {
      err.textContent = e instanceof APIError && e.status === 401
        ? 'That key was refused: it is unknown, revoked or mistyped.'
        : 'Could not sign in: ' + e.message;
      input.focus();
      return;
    }
    let admin = false;
    try {
      await get('/v1/keys', { key });
      admin = true;
    } catch { /* 403: not an admin key */ }
    auth.set(key, admin);
    input.value = '';
    route();
  });
  main.replaceChildren(form);
  input.focus();
}

onUnauthenticated(() => {
  auth.clear();
  if (current) current.abort();
  signIn('The key stopped working (revoked?). Sign in again.');
});

document.getElementById('logout').addEventListener('click', () => {
  auth.clear();
  say('Signed out.');
  location.hash = '';
  route();
});
window.addEventListener('hashchange', route);
route();
