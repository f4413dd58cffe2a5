// Kiln's Node.js REPL driver. Protocol (see node.go):
//   requests on fd 3, one JSON line each: {"id":N,"code":"...","env":{...}}
//   after each cell: the marker "\x02kiln-TOKEN-N\x03" on stdout and on
//   stderr, then the line `N {"data":{mime:text}|null,"error":{...}|null}`
//   on fd 4. At start-up the driver answers as if cell 0 had run.
//   Before the process exits on its own: `exit CODE` on fd 4.
'use strict';
const fs = require('fs');
const vm = require('vm');
const util = require('util');
const path = require('path');
const net = require('net');
const readline = require('readline');
const { createRequire } = require('module');

const TOKEN = process.env.KILN_REPL_TOKEN;
const LANG = process.env.KILN_REPL_LANG || 'javascript';
delete process.env.KILN_REPL_TOKEN;
delete process.env.KILN_REPL_LANG;

// Re-open the protocol pipes close-on-exec, so processes the user spawns
// do not hold them (the agent detects our death by EOF on fd 4).
function reopen(fd, flags) {
  try {
    const n = fs.openSync('/proc/self/fd/' + fd, flags);
    fs.closeSync(fd);
    return n;
  } catch {
    return fd;
  }
}
const reqFd = reopen(3, 'r');
const respFd = reopen(4, 'w');

const outWrite = process.stdout.write.bind(process.stdout);
const errWrite = process.stderr.write.bind(process.stderr);
const marker = (id) => '\x02kiln-' + TOKEN + '-' + id + '\x03';

function respond(line) {
  const b = Buffer.from(line + '\n');
  for (let off = 0; off < b.length;) {
    try {
      off += fs.writeSync(respFd, b, off);
    } catch (e) {
      if (e.code !== 'EAGAIN') throw e;
    }
  }
}

process.on('exit', (code) => {
  try { respond('exit ' + code); } catch {}
});
process.on('uncaughtException', (e) => {
  errWrite('Uncaught ' + (e && e.stack ? e.stack : util.inspect(e)) + '\n');
});
process.on('unhandledRejection', (e) => {
  errWrite('Unhandled rejection: ' + (e && e.stack ? e.stack : util.inspect(e)) + '\n');
});

// The one persistent context cells run in.
const context = vm.createContext();
const g = vm.runInContext('globalThis', context);
for (const name of Object.getOwnPropertyNames(globalThis)) {
  if (name in g) continue;
  Object.defineProperty(g, name, Object.getOwnPropertyDescriptor(globalThis, name));
}
const cwd = process.cwd();
g.global = g;
g.console = console;
g.require = createRequire(path.join(cwd, '[kiln-repl]'));
g.module = { exports: {}, require: g.require, id: '[kiln-repl]', filename: path.join(cwd, '[kiln-repl]') };
g.exports = g.module.exports;
g.__filename = g.module.filename;
g.__dirname = cwd;

// ---- interrupts ----
let current = null; // {reject} of the cell being awaited
process.on('SIGINT', () => {
  if (current) current.reject(interrupted());
});
function interrupted() {
  const e = new Error('Script execution was interrupted by `SIGINT`');
  e.code = 'ERR_SCRIPT_EXECUTION_INTERRUPTED';
  return e;
}

// ---- top-level await ----
// A small scanner: enough JavaScript lexing to find brackets, strings,
// templates, comments and regular expressions, so that top-level
// declarations can be rewritten into assignments that outlive the async
// wrapper a cell with top-level await runs in.
const regexAfter = new Set(['return', 'typeof', 'case', 'do', 'else', 'in', 'of', 'new', 'delete', 'void', 'throw', 'instanceof', 'yield', 'await']);
function scan(src) {
  const toks = [];
  const n = src.length;
  let i = 0, depth = 0, prev = null;
  const braces = []; // true for a template's ${
  const push = (type, start, end) => {
    const t = { type, start, end, depth, v: src.slice(start, end) };
    toks.push(t);
    if (type !== 'nl') prev = t;
    return t;
  };
  const template = (j) => { // j just after ` or }; returns [end, opened${]
    while (j < n) {
      const c = src[j];
      if (c === '\\') { j += 2; continue; }
      if (c === '`') return [j + 1, false];
      if (c === '$' && src[j + 1] === '{') return [j + 2, true];
      j++;
    }
    return [n, false];
  };
  while (i < n) {
    const c = src[i];
    if (c === '\n') { push('nl', i, i + 1); i++; continue; }
    if (c === ' ' || c === '\t' || c === '\r' || c === '\f' || c === '\v' || c === '\ufeff' || c === '\u00a0') { i++; continue; }
    if (c === '/' && src[i + 1] === '/') { while (i < n && src[i] !== '\n') i++; continue; }
    if (c === '/' && src[i + 1] === '*') {
      const e = src.indexOf('*/', i + 2);
      const end = e < 0 ? n : e + 2;
      if (src.slice(i, end).includes('\n')) push('nl', i, i);
      i = end;
      continue;
    }
    if (c === '"' || c === "'") {
      let j = i + 1;
      while (j < n && src[j] !== c && src[j] !== '\n') j += src[j] === '\\' ? 2 : 1;
      push('str', i, Math.min(j + 1, n));
      i = j + 1;
      continue;
    }
    if (c === '`') {
      const [end, opened] = template(i + 1);
      push('str', i, end);
      if (opened) { braces.push(true); depth++; }
      i = end;
      continue;
    }
    if (/[A-Za-z_$\u0080-\uffff]/.test(c)) {
      let j = i + 1;
      while (j < n && /[\w$\u0080-\uffff]/.test(src[j])) j++;
      push('id', i, j);
      i = j;
      continue;
    }
    if (/[0-9]/.test(c) || (c === '.' && /[0-9]/.test(src[i + 1] || ''))) {
      let j = i + 1;
      while (j < n && /[\w.]/.test(src[j])) j++;
      push('num', i, j);
      i = j;
      continue;
    }
    if (c === '/') {
      const re = prev === null || (prev.type === 'punct' && !/[)\]}]/.test(prev.v)) ||
        (prev.type === 'id' && regexAfter.has(prev.v));
      if (re) {
        let j = i + 1, cls = false;
        while (j < n && src[j] !== '\n') {
          const d = src[j];
          if (d === '\\') { j += 2; continue; }
          if (d === '[') cls = true;
          else if (d === ']') cls = false;
          else if (d === '/' && !cls) break;
          j++;
        }
        j++;
        while (j < n && /\w/.test(src[j])) j++;
        push('regex', i, j);
        i = j;
        continue;
      }
    }
    if (c === '(' || c === '[' || c === '{') {
      push('punct', i, i + 1);
      if (c === '{') braces.push(false);
      depth++;
      i++;
      continue;
    }
    if (c === ')' || c === ']' || c === '}') {
      depth = Math.max(depth - 1, 0);
      if (c === '}' && braces.pop()) { // the end of a template's ${...}
        const [end, opened] = template(i + 1);
        push('str', i, end);
        if (opened) { braces.push(true); depth++; }
        i = end;
        continue;
      }
      push('punct', i, i + 1);
      i++;
      continue;
    }
    push('punct', i, i + 1);
    i++;
  }
  return toks;
}

function compiles(src) {
  try {
    new vm.Script(src);
    return true;
  } catch {
    return false;
  }
}

const notExpression = new Set(['let', 'const', 'var', 'class', 'function', 'if', 'for', 'while', 'do',
  'try', 'switch', 'return', 'throw', 'import', 'export', 'break', 'continue']);

// wrapAwait turns a cell using top-level await into an async function
// call whose value is the cell's last expression; top-level var, let and
// const become assignments to globals, functions and classes are copied
// onto globalThis. It returns null if the cell cannot be wrapped.
function wrapAwait(src) {
  const toks = scan(src);
  const sig = (k) => { for (; k < toks.length; k++) if (toks[k].type !== 'nl') return k; return -1; };
  // Split off the last expression statement: the smallest split point
  // where the rest is an expression and the head a valid body.
  const cuts = [0];
  for (const t of toks) {
    if (t.depth === 0 && (t.type === 'nl' || (t.type === 'punct' && (t.v === ';' || t.v === '}')))) cuts.push(t.end);
  }
  let head = src, tail = null;
  for (const p of cuts) {
    const rest = src.slice(p).replace(/[\s;]+$/, '');
    if (rest.trim() === '') continue;
    const first = toks.find((t) => t.start >= p && t.type !== 'nl');
    if (!first || (first.type === 'id' && notExpression.has(first.v))) continue;
    if (first.v === 'async') {
      const k = toks.indexOf(first);
      const nx = toks[sig(k + 1)];
      if (nx && nx.v === 'function') continue;
    }
    if (!compiles('(async () => (\n' + rest + '\n))')) continue;
    if (!compiles('(async () => {\n' + src.slice(0, p) + '\n})')) continue;
    head = src.slice(0, p);
    tail = rest;
    break;
  }
  // Rewrite the head's top-level declarations.
  const edits = []; // [pos, deleteCount, insert]
  const hoist = [];
  const headToks = toks.filter((t) => t.end <= head.length);
  const atStatementStart = (k) => {
    for (let j = k - 1; j >= 0; j--) {
      const t = headToks[j];
      if (t.type === 'nl') return true;
      return t.type === 'punct' && (t.v === ';' || t.v === '}');
    }
    return true;
  };
  for (let k = 0; k < headToks.length; k++) {
    const t = headToks[k];
    if (t.depth !== 0 || t.type !== 'id') continue;
    const nk = sig(k + 1);
    const next = nk >= 0 && nk < headToks.length ? headToks[nk] : null;
    if (!next) continue;
    if ((t.v === 'let' || t.v === 'const' || t.v === 'var') && atStatementStart(k) &&
        (next.type === 'id' || next.v === '{' || next.v === '[')) {
      // The declaration runs to the next top-level ; or line break.
      let end = headToks.length;
      for (let j = nk; j < headToks.length; j++) {
        const u = headToks[j];
        if (u.depth === 0 && (u.v === ';' || u.type === 'nl') && j > nk) { end = j; break; }
      }
      const endPos = end < headToks.length ? headToks[end].start : head.length;
      edits.push([t.start, t.v.length, next.v === '{' ? ';(' : ';void (']);
      edits.push([endPos, 0, ')']);
      // Declarators without initialiser get one.
      let j = nk;
      while (j < end) {
        const d = headToks[j];
        const after = sig(j + 1);
        if (d.type === 'id' && (after < 0 || after >= end || headToks[after].v === ',')) {
          edits.push([d.end, 0, ' = undefined']);
        }
        // skip to the next top-level comma of this declaration
        let m = j + 1;
        while (m < end && !(headToks[m].depth === 0 && headToks[m].v === ',')) m++;
        j = sig(m + 1);
        if (j < 0) break;
      }
      continue;
    }
    if (t.v === 'function' && atStatementStart(k - (k > 0 && headToks[k - 1].v === 'async' ? 1 : 0))) {
      let nameTok = next;
      if (next.v === '*') nameTok = headToks[sig(nk + 1)];
      if (nameTok && nameTok.type === 'id') hoist.push(nameTok.v);
      continue;
    }
    if (t.v === 'class' && atStatementStart(k) && next.type === 'id') {
      edits.push([t.start, 0, ';' + next.v + ' = ']);
      for (let j = nk; j < headToks.length; j++) {
        if (headToks[j].depth === 0 && headToks[j].v === '{') {
          for (let m = j + 1; m < headToks.length; m++) {
            if (headToks[m].depth === 0 && headToks[m].v === '}') { edits.push([headToks[m].end, 0, ';']); break; }
          }
          break;
        }
      }
    }
  }
  edits.sort((a, b) => a[0] - b[0]);
  let out = '';
  let pos = 0;
  for (const [at, del, ins] of edits) {
    out += head.slice(pos, at) + ins;
    pos = at + del;
  }
  out += head.slice(pos);
  const pre = hoist.map((n) => 'globalThis.' + n + ' = ' + n + ';').join(' ');
  const code = '(async () => {' + pre + '\n' + out + '\n' +
    (tail === null ? '})()' : ';return (\n' + tail + '\n)})()');
  return compiles(code) ? code : null;
}

// ---- ES module imports ----
// A cell is a script, where `import x from 'm'` is a syntax error; as in
// E2B's JavaScript kernel, such top-level import declarations become
// declarations of what `await import('m')` returns, which the
// top-level-await rewrite then makes globals.
function rewriteImports(src) {
  const toks = scan(src).filter((t) => t.type !== 'nl');
  const edits = [];
  const quoted = (t) => t && t.type === 'str' && /^["']/.test(t.v);
  for (let k = 0; k < toks.length; k++) {
    const t = toks[k];
    if (t.type !== 'id' || t.v !== 'import' || (k > 0 && toks[k - 1].v === '.')) continue; // not obj.import
    let j = k + 1;
    const next = toks[j];
    if (next && next.v === '(') { // import(): the driver's own, see importDynamic
      let close = j + 1;
      while (close < toks.length && !(toks[close].v === ')' && toks[close].depth === t.depth)) close++;
      const after = toks[close + 1];
      if (!after || after.v !== '{') edits.push([t.start, t.end, '__kiln_import']); // else a method named import
      continue;
    }
    if (!next || next.v === '.') continue; // import.meta
    const prev = toks[k - 1];
    if (t.depth !== 0 || (prev && !(prev.type === 'punct' && (prev.v === ';' || prev.v === '}')) &&
        src.slice(prev.end, t.start).indexOf('\n') < 0)) continue; // not a declaration
    let def = null, ns = null, named = null, spec = null;
    if (quoted(next)) {
      spec = next;
    } else {
      if (next.type === 'id' && next.v !== 'from') { def = next.v; j++; if (toks[j] && toks[j].v === ',') j++; }
      if (toks[j] && toks[j].v === '*' && toks[j + 1] && toks[j + 1].v === 'as' && toks[j + 2] && toks[j + 2].type === 'id') {
        ns = toks[j + 2].v;
        j += 3;
      } else if (toks[j] && toks[j].v === '{') {
        named = [];
        j++;
        while (toks[j] && toks[j].v !== '}') {
          const name = toks[j];
          if (name.type !== 'id') { named = null; break; }
          let local = name.v;
          if (toks[j + 1] && toks[j + 1].v === 'as' && toks[j + 2] && toks[j + 2].type === 'id') { local = toks[j + 2].v; j += 2; }
          named.push(name.v === local ? local : name.v + ': ' + local);
          j++;
          if (toks[j] && toks[j].v === ',') j++;
        }
        if (named === null || !toks[j]) continue;
        j++;
      }
      if (!toks[j] || toks[j].v !== 'from' || !quoted(toks[j + 1])) continue;
      spec = toks[j + 1];
    }
    let end = spec.end;
    let m = toks.indexOf(spec) + 1;
    if (toks[m] && (toks[m].v === 'assert' || toks[m].v === 'with') && toks[m + 1] && toks[m + 1].v === '{') {
      while (toks[m] && toks[m].v !== '}') m++;
      if (toks[m]) { end = toks[m].end; m++; }
    }
    if (toks[m] && toks[m].v === ';') end = toks[m].end;
    const load = '(await __kiln_import(' + spec.v + '))';
    let decl;
    if (ns !== null) decl = 'const ' + ns + ' = ' + load + (def !== null ? ', ' + def + ' = ' + ns + '.default' : '') + ';';
    else if (named !== null) decl = 'const {' + (def !== null ? ['default: ' + def, ...named] : named).join(', ') + '} = ' + load + ';';
    else if (def !== null) decl = 'const ' + def + ' = ' + load + '.default;';
    else decl = 'await __kiln_import(' + spec.v + ');';
    // Keep the cell's line numbers.
    const lines = src.slice(t.start, end).split('\n').length - 1;
    edits.push([t.start, end, decl + '\n'.repeat(lines)]);
  }
  let out = '';
  let pos = 0;
  for (const [from, to, text] of edits) {
    out += src.slice(pos, from) + text;
    pos = to;
  }
  return edits.length ? out + src.slice(pos) : null;
}

// importDynamic loads what a cell's import() names (cells call it as
// __kiln_import: import() in a vm script would need
// --experimental-vm-modules): built-in modules by name, anything else
// resolved from the working directory as require would (node_modules
// there, relative paths), else as given.
function importDynamic(specifier) {
  specifier = String(specifier);
  let target = specifier;
  if (!require('module').isBuiltin(specifier)) {
    try {
      target = require('url').pathToFileURL(g.require.resolve(specifier)).href;
    } catch {}
  }
  return import(target);
}

Object.defineProperty(g, '__kiln_import', { value: importDynamic });

// ---- TypeScript ----
let ts; // the typescript module, if one is installed
function transpile(src) {
  if (ts === undefined) {
    ts = null;
    const roots = [cwd, '/usr/local/lib/node_modules', '/usr/lib/node_modules', '/usr/share/nodejs'];
    for (const r of roots) {
      try {
        ts = createRequire(path.join(r, 'noop.js'))('typescript');
        break;
      } catch {}
    }
  }
  if (ts) {
    return ts.transpileModule(src, {
      compilerOptions: { target: ts.ScriptTarget.ES2022, module: ts.ModuleKind.ESNext, sourceMap: false },
      reportDiagnostics: false,
    }).outputText.replace(/^export \{\};?\s*$/m, '');
  }
  const m = require('module');
  if (typeof m.stripTypeScriptTypes === 'function') return m.stripTypeScriptTypes(src);
  return src; // plain JavaScript is valid TypeScript
}

// ---- evaluation ----
async function evaluate(src, id) {
  const filename = 'cell[' + id + ']';
  let script = null, wrapped = false;
  if (/^\s*\{/.test(src) && /\}\s*$/.test(src)) {
    try { script = new vm.Script('(' + src + '\n)', { filename }); } catch {} // an object literal
  }
  if (script === null) {
    const imported = /\bimport\b/.test(src) ? rewriteImports(src) : null;
    if (imported !== null) src = imported;
    try {
      script = new vm.Script(src, { filename });
    } catch (e) {
      const code = e && e.name === 'SyntaxError' && /\bawait\b/.test(src) ? wrapAwait(src) : null;
      if (code === null) throw e;
      script = new vm.Script(code, { filename, lineOffset: -1 });
      wrapped = true;
    }
  }
  const value = script.runInContext(context, { breakOnSigint: true, displayErrors: false });
  if (!wrapped) return value;
  return await new Promise((resolve, reject) => {
    current = { reject };
    Promise.resolve(value).then(resolve, reject);
  }).finally(() => { current = null; });
}

function format(value) {
  const data = { 'text/plain': util.inspect(value, { depth: 4, maxArrayLength: 200, maxStringLength: 100000 }) };
  if (value !== null && typeof value === 'object' &&
      (Array.isArray(value) || Object.prototype.toString.call(value) === '[object Object]')) {
    const proto = Object.getPrototypeOf(value);
    if (Array.isArray(value) || proto === null || Object.getPrototypeOf(proto) === null) {
      try {
        const j = JSON.stringify(value);
        if (j !== undefined && j.length <= 1 << 20) data['application/json'] = j;
      } catch {}
    }
  }
  return data;
}

function cleanStack(stack) {
  return stack.split('\n').filter((l) => !/\(node:|\[stdin\]|^\s+at node:/.test(l)).join('\n');
}

function formatError(e) {
  if (e && e.code === 'ERR_SCRIPT_EXECUTION_INTERRUPTED') {
    return { name: 'Interrupted', value: 'execution interrupted', traceback: '' };
  }
  if (e !== null && typeof e === 'object' && typeof e.stack === 'string') {
    const name = String(e.name || (e.constructor && e.constructor.name) || 'Error');
    return { name, value: String(e.message ?? ''), traceback: cleanStack(e.stack) };
  }
  const s = util.inspect(e);
  return { name: 'Uncaught', value: s, traceback: 'Uncaught ' + s };
}

function applyEnv(env) {
  const saved = {};
  for (const k of Object.keys(env || {})) {
    saved[k] = Object.prototype.hasOwnProperty.call(process.env, k) ? process.env[k] : undefined;
    process.env[k] = env[k];
  }
  return saved;
}

function restoreEnv(saved) {
  for (const k of Object.keys(saved)) {
    if (saved[k] === undefined) delete process.env[k];
    else process.env[k] = saved[k];
  }
}

function finish(id, data, error) {
  outWrite(marker(id));
  errWrite(marker(id));
  respond(id + ' ' + JSON.stringify({ data, error }));
}

async function runCell(req) {
  let data = null, error = null;
  const saved = applyEnv(req.env);
  try {
    let src = req.code;
    if (LANG === 'typescript') src = transpile(src);
    const value = await evaluate(src, req.id);
    if (value !== undefined) data = format(value);
  } catch (e) {
    error = formatError(e);
  } finally {
    restoreEnv(saved);
  }
  finish(req.id, data, error);
}

let queue = Promise.resolve();
const input = new net.Socket({ fd: reqFd, readable: true, writable: false });
const rl = readline.createInterface({ input, crlfDelay: Infinity });
rl.on('line', (line) => {
  let req;
  try {
    req = JSON.parse(line);
  } catch {
    return;
  }
  queue = queue.then(() => runCell(req));
});
rl.on('close', () => process.exit(0));
finish(0, null, null);
