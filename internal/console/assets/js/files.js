// The file browser: list a directory, go into folders, view text and
// images, download, delete, and upload by drag-and-drop or a file input
// (one multipart POST into the current directory).
import { get, call, query, sbPath } from './api.js';
import { h, field, fmtBytes, ago, say, errText, confirm, download, empty } from './ui.js';

const IMAGE = { png: 'image/png', jpg: 'image/jpeg', jpeg: 'image/jpeg', gif: 'image/gif', webp: 'image/webp', svg: 'image/svg+xml' };
const MAX_VIEW = 1 << 20;

export async function filesTab(panel, current, signal) {
  const id = current().id;
  let dir = sessionStorage.getItem('kiln.dir.' + id) || '/home/user';
  const pathInput = h('input', { type: 'text', name: 'path', value: dir, spellcheck: 'false' });
  const listBox = h('div', { id: 'file-list' });
  const viewer = h('div', { class: 'viewer', 'aria-live': 'polite' });
  const fileInput = h('input', { type: 'file', multiple: true, name: 'upload', id: 'file-upload' });
  const drop = h('div', { class: 'drop', id: 'drop-zone', tabindex: '0', role: 'group', 'aria-label': 'Upload: drop files here' },
    h('p', {}, 'Drop files here to upload them into this folder, or '),
    field('choose files', fileInput));
  const go = h('form', { class: 'pathbar', onsubmit: (e) => { e.preventDefault(); load(pathInput.value.trim() || '/'); } },
    field('Folder', pathInput), h('button', { type: 'submit', text: 'Open' }),
    h('button', { type: 'button', text: 'Up', onclick: () => load(parent(dir)) }));
  panel.append(go, drop, listBox, viewer);

  async function load(d) {
    try {
      const entries = await get(sbPath(id, '/files/list' + query({ path: d })), { signal });
      dir = d;
      pathInput.value = d;
      sessionStorage.setItem('kiln.dir.' + id, d);
      entries.sort((a, b) => (a.type === 'dir') === (b.type === 'dir') ? a.name.localeCompare(b.name) : a.type === 'dir' ? -1 : 1);
      listBox.replaceChildren(entries.length ? h('div', { class: 'scroll' }, h('table', { class: 'list' },
        h('caption', { class: 'sr', text: 'Files in ' + d }),
        h('thead', {}, h('tr', {}, ['Name', 'Size', 'Mode', 'Owner', 'Modified', ''].map((x) => h('th', { scope: 'col', text: x })))),
        h('tbody', {}, entries.map(row)))) : empty('This folder is empty.'));
    } catch (e) {
      if (e.name !== 'AbortError') say(errText(e), true);
    }
  }

  function row(f) {
    const name = f.type === 'dir'
      ? h('button', { type: 'button', class: 'link', text: f.name + '/', onclick: () => load(f.path) })
      : h('button', { type: 'button', class: 'link', text: f.name, onclick: () => view(f) });
    return h('tr', { 'data-path': f.path }, h('th', { scope: 'row' }, name),
      h('td', { text: f.type === 'dir' ? '' : fmtBytes(f.size) }), h('td', { text: '0' + (f.mode || 0).toString(8) }),
      h('td', { text: f.owner || '' }), h('td', { text: ago(f.mod_time) }),
      h('td', { class: 'actions' },
        f.type === 'file' ? h('button', { type: 'button', text: 'Download', 'aria-label': 'Download ' + f.name, onclick: async () => {
          try { download(await blob(f.path), f.name); } catch (e) { say(errText(e), true); }
        } }) : null,
        h('button', { type: 'button', class: 'danger', text: 'Delete', 'aria-label': 'Delete ' + f.name, onclick: async () => {
          if (!await confirm(`Delete ${f.path}${f.type === 'dir' ? ' and everything in it' : ''}?`, 'Delete')) return;
          try { await call('DELETE', sbPath(id, '/files' + query({ path: f.path }))); say('Deleted ' + f.name); load(dir); } catch (e) { say(errText(e), true); }
        } })));
  }

  async function blob(path) {
    const res = await call('GET', sbPath(id, '/files' + query({ path })), { raw: true, signal });
    return res.blob();
  }

  async function view(f) {
    const ext = f.name.split('.').pop().toLowerCase();
    viewer.replaceChildren(h('h2', { text: f.path }));
    if (f.size > MAX_VIEW && !IMAGE[ext]) { viewer.append(empty('Too large to show here; download it.')); return; }
    try {
      const b = await blob(f.path);
      if (IMAGE[ext]) {
        const url = URL.createObjectURL(new Blob([b], { type: IMAGE[ext] }));
        const img = h('img', { src: url, alt: f.name, class: 'preview' });
        img.addEventListener('load', () => URL.revokeObjectURL(url));
        viewer.append(img);
      } else {
        const t = new TextDecoder('utf-8', { fatal: false }).decode(await b.arrayBuffer());
        viewer.append(/[\x00-\x08\x0e-\x1f]/.test(t.slice(0, 4096)) ? empty('A binary file; download it.') : h('pre', { class: 'text', tabindex: '0', text: t }));
      }
    } catch (e) {
      viewer.append(h('p', { class: 'error', text: errText(e) }));
    }
  }

  async function upload(files) {
    if (!files.length) return;
    const form = new FormData();
    for (const f of files) form.append('file', f, f.name);
    say(`Uploading ${files.length} file(s)…`);
    try {
      const out = await call('POST', sbPath(id, '/files' + query({ dir })), { body: form });
      say('Uploaded ' + out.map((f) => f.name).join(', '));
      load(dir);
    } catch (e) {
      say(errText(e), true);
    }
  }
  fileInput.addEventListener('change', () => { upload([...fileInput.files]); fileInput.value = ''; });
  drop.addEventListener('dragover', (e) => { e.preventDefault(); drop.classList.add('over'); });
  drop.addEventListener('dragleave', () => drop.classList.remove('over'));
  drop.addEventListener('drop', (e) => { e.preventDefault(); drop.classList.remove('over'); upload([...e.dataTransfer.files]); });
  await load(dir);
}

const parent = (p) => p.replace(/\/[^/]+\/?$/, '') || '/';
