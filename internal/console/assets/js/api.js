// The public API, called with the signed-in key in a header. The key lives
// in sessionStorage (this tab only, gone when it closes), never in a URL.

const KEY = 'kiln.apiKey';
const ADMIN = 'kiln.admin';

export const auth = {
  key: () => sessionStorage.getItem(KEY),
  admin: () => sessionStorage.getItem(ADMIN) === '1',
  set(key, admin) { sessionStorage.setItem(KEY, key); sessionStorage.setItem(ADMIN, admin ? '1' : '0'); },
  clear() { sessionStorage.removeItem(KEY); sessionStorage.removeItem(ADMIN); },
};

// APIError is an Error answer: {code, message, request_id}.
export class APIError extends Error {
  constructor(status, body) {
    super(body && body.message || `HTTP ${status}`);
    this.status = status;
    this.code = body && body.code;
    this.requestId = body && body.request_id;
  }
}

let unauthenticated = () => {};
// onUnauthenticated sets what happens when the key stops working.
export function onUnauthenticated(f) { unauthenticated = f; }

// query makes "?a=1&b=2" from an object; array values repeat.
export function query(params = {}) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) {
    if (v === undefined || v === null || v === '') continue;
    for (const x of [].concat(v)) q.append(k, x);
  }
  const s = q.toString();
  return s ? '?' + s : '';
}

// call makes one request. body: an object (sent as JSON), or a string,
// Blob, File or FormData sent as is. It resolves to the parsed JSON, null
// for 204, or the Response itself with raw (downloads, streams).
export async function call(method, path, { body, raw, signal, accept, key } = {}) {
  const headers = { Authorization: 'Bearer ' + (key || auth.key()) };
  if (accept) headers.Accept = accept;
  let payload = body;
  if (body !== undefined && !(typeof body === 'string' || body instanceof Blob || body instanceof FormData)) {
    payload = JSON.stringify(body);
    headers['Content-Type'] = 'application/json';
  }
  const res = await fetch(path, { method, headers, body: payload, signal, cache: 'no-store', credentials: 'omit' });
  if (!res.ok) {
    let e = null;
    try { e = await res.json(); } catch { /* not an api.Error */ }
    const err = new APIError(res.status, e);
    if (res.status === 401 && !key) unauthenticated(err);
    throw err;
  }
  if (raw) return res;
  if (res.status === 204 || res.status === 202 && !res.headers.get('Content-Type')) return null;
  return res.json();
}

export const get = (path, o) => call('GET', path, o);
export const post = (path, body, o = {}) => call('POST', path, { ...o, body });

// events reads an NDJSON stream of events, calling f with each; it ends
// with the stream. f returning false stops reading.
export async function events(res, f) {
  const reader = res.body.getReader();
  const dec = new TextDecoder();
  let buf = '';
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += dec.decode(value, { stream: true });
      let i;
      while ((i = buf.indexOf('\n')) >= 0) {
        const line = buf.slice(0, i);
        buf = buf.slice(i + 1);
        if (line.trim() && f(JSON.parse(line)) === false) return;
      }
    }
  } finally {
    reader.cancel().catch(() => {});
  }
}

export function bytes(b64) {
  const bin = atob(b64 || '');
  const out = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
  return out;
}

export const text = (b64) => new TextDecoder().decode(bytes(b64));

export const sbPath = (id, rest = '') => '/v1/sandboxes/' + encodeURIComponent(id) + rest;
