// DOM helpers: elements are built with textContent and attributes, never
// from HTML strings, so nothing a sandbox printed can become markup.

// h builds an element. attrs: class, text, on<event> handlers, properties
// (value, checked, ...) for non-string values, attributes otherwise.
export function h(tag, attrs = {}, ...kids) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith('on') && typeof v === 'function') el.addEventListener(k.slice(2), v);
    else if (k === 'class') el.className = v;
    else if (k === 'text') el.textContent = v;
    else if (typeof v !== 'string' && k in el) el[k] = v;
    else el.setAttribute(k, v === true ? '' : String(v));
  }
  for (const kid of kids.flat(Infinity)) {
    if (kid === null || kid === undefined || kid === false) continue;
    el.append(kid instanceof Node ? kid : String(kid));
  }
  return el;
}

// field is a labelled form control.
export function field(label, control, hint) {
  const id = control.id || 'f-' + Math.random().toString(36).slice(2, 9);
  control.id = id;
  return h('div', { class: 'field' }, h('label', { for: id, text: label }), control,
    hint ? h('small', { text: hint }) : null);
}

export function fmtBytes(n) {
  if (n === undefined || n === null) return '';
  const u = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0;
  while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
  return (i ? n.toFixed(n < 10 ? 1 : 0) : n) + ' ' + u[i];
}

// fmtSpan says a duration in seconds shortly: 42s, 5m, 3h 2m, 2d 4h.
export function fmtSpan(s) {
  s = Math.max(0, Math.round(s));
  if (s < 60) return s + 's';
  if (s < 3600) return Math.floor(s / 60) + 'm ' + (s % 60) + 's';
  if (s < 86400) return Math.floor(s / 3600) + 'h ' + Math.floor(s % 3600 / 60) + 'm';
  return Math.floor(s / 86400) + 'd ' + Math.floor(s % 86400 / 3600) + 'h';
}

export const ago = (t) => t ? fmtSpan((Date.now() - Date.parse(t)) / 1000) + ' ago' : '';
export const until = (t) => {
  if (!t) return '';
  const s = (Date.parse(t) - Date.now()) / 1000;
  return s >= 0 ? 'in ' + fmtSpan(s) : fmtSpan(-s) + ' ago';
};
export const when = (t) => t ? new Date(t).toLocaleString() : '';

// say announces a message in the live region (errors as alerts).
export function say(msg, error = false) {
  const st = document.getElementById('status');
  st.setAttribute('role', error ? 'alert' : 'status');
  st.className = 'status' + (error ? ' error' : '') + (msg ? ' shown' : '');
  st.textContent = msg;
  clearTimeout(say.t);
  if (msg) say.t = setTimeout(() => { st.className = 'status'; st.textContent = ''; }, error ? 8000 : 3000);
}

// errText is what a user reads of a failed call.
export function errText(e) {
  if (e && e.code) return `${e.message} (${e.code}${e.requestId ? ', request ' + e.requestId : ''})`;
  return String(e && e.message || e);
}

// confirm asks in the page's modal dialog; resolves true on Confirm.
export function confirm(text, ok = 'Confirm') {
  const d = document.getElementById('confirm');
  document.getElementById('confirm-text').textContent = text;
  document.getElementById('confirm-ok').textContent = ok;
  d.returnValue = '';
  d.showModal();
  return new Promise((resolve) => d.addEventListener('close', () => resolve(d.returnValue === 'ok'), { once: true }));
}

export function badge(state, reason) {
  return h('span', { class: 'badge s-' + state, title: reason || null, text: state });
}

// table builds a table with a caption (for screen readers) and headers.
export function table(caption, headers, rows, cls = '') {
  return h('div', { class: 'scroll' }, h('table', { class: cls },
    h('caption', { class: 'sr', text: caption }),
    h('thead', {}, h('tr', {}, headers.map((x) => h('th', { scope: 'col', text: x })))),
    h('tbody', {}, rows)));
}

export function empty(text) { return h('p', { class: 'muted', text }); }

// download saves a Blob under name.
export function download(blob, name) {
  const url = URL.createObjectURL(blob);
  const a = h('a', { href: url, download: name });
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10000);
}

// stripANSI removes terminal colour codes from tracebacks.
export const stripANSI = (s) => String(s).replace(/\x1b\[[0-9;]*[A-Za-z]/g, '');
