// A small Dockerfile compiler for builds started from the console, giving
// the same TemplateSpec as the CLI's (internal/template/dockerfile, which
// the browser test compares it with) for what it supports: FROM (a
// template or an image), RUN (shell and exec form), ENV (with $NAME of
// earlier ENVs; the base's variables are left for the build to expand),
// WORKDIR, USER, CMD/ENTRYPOINT (the start command), comments and line
// continuations; EXPOSE, LABEL and the like are ignored. COPY and ADD need
// the build context's files, which one uploaded file does not carry, and
// ARG, heredocs and flags need the CLI: it refuses them, naming the line.

const SAFE = /^[A-Za-z0-9_@%+:,./-]+$/;
const RESERVED = new Set(['!', '{', '}', 'case', 'do', 'done', 'elif', 'else', 'esac', 'fi', 'for', 'if', 'in', 'then', 'until', 'while']);
const MARK = '\u0000'; // brackets a variable left to the build

// quoteArgs is a command line for /bin/sh -c that runs args as they are.
const quoteArgs = (args) => args.map((a, i) => SAFE.test(a) && (i > 0 || !RESERVED.has(a)) ? a : "'" + a.replace(/'/g, "'\\''") + "'").join(' ');

// shellWord escapes a value for the engine's printf '%s' "<value>",
// turning the marked variables into ${NAME}.
function shellWord(v) {
  return v.split(MARK).map((p, i) => i % 2 ? '${' + p + '}' : p.replace(/[$`"\\]/g, '\\$&')).join('');
}

export function compileDockerfile(src, isTemplate) {
  const fail = (n, msg) => { throw new Error(`Dockerfile:${n}: ${msg}`); };
  const lines = [];
  let buf = '', start = 0;
  src.split(/\r?\n/).forEach((raw, i) => {
    const t = raw.trim();
    if (!buf && (t === '' || t.startsWith('#'))) return;
    if (buf && t.startsWith('#')) return; // a comment inside a continuation
    if (!buf) start = i + 1;
    if (t.endsWith('\\')) { buf += raw.replace(/\\\s*$/, ''); return; }
    buf += raw;
    lines.push([start, buf.trim()]);
    buf = '';
  });
  if (buf.trim()) lines.push([start, buf.trim()]);

  const spec = { from: {}, steps: [] };
  const env = {};
  let workdir = '', cmd = null, entry = null, from = false;
  const execForm = (rest) => {
    if (!rest.startsWith('[')) return null;
    try { const a = JSON.parse(rest); return Array.isArray(a) && a.every((x) => typeof x === 'string') ? a : null; } catch { return null; }
  };
  // expand reads one word of ENV: quotes, escapes and $NAME / ${NAME}.
  const expand = (n, s) => {
    let out = '', i = 0;
    const variable = () => {
      let name;
      if (s[i + 1] === '{') {
        const end = s.indexOf('}', i);
        if (end < 0) fail(n, 'unterminated ${');
        name = s.slice(i + 2, end);
        if (!/^[A-Za-z_]\w*$/.test(name)) fail(n, '${' + name + '} needs the CLI (kiln template build)');
        i = end + 1;
      } else {
        const m = s.slice(i + 1).match(/^[A-Za-z_]\w*/);
        if (!m) { out += '$'; i++; return; }
        name = m[0];
        i += 1 + name.length;
      }
      out += name in env ? env[name] : MARK + name + MARK;
    };
    while (i < s.length) {
      const c = s[i];
      if (c === "'") {
        const end = s.indexOf("'", i + 1);
        if (end < 0) fail(n, 'unterminated quote');
        out += s.slice(i + 1, end);
        i = end + 1;
      } else if (c === '"') {
        i++;
        while (i < s.length && s[i] !== '"') {
          if (s[i] === '\\' && i + 1 < s.length) { out += s[i + 1]; i += 2; } else if (s[i] === '$') variable(); else out += s[i++];
        }
        if (s[i] !== '"') fail(n, 'unterminated quote');
        i++;
      } else if (c === '\\' && i + 1 < s.length) { out += s[i + 1]; i += 2; } else if (c === '$') variable(); else out += s[i++];
    }
    return out;
  };
  // words splits on unquoted blanks.
  const words = (s) => s.match(/(?:[^\s"'\\]+|\\.|"(?:[^"\\]|\\.)*"|'[^']*')+/g) || [];

  for (const [n, line] of lines) {
    const m = line.match(/^(\S+)\s*([\s\S]*)$/);
    const op = m[1].toUpperCase(), rest = m[2].trim();
    if (op !== 'FROM' && !from) fail(n, op + ' before FROM');
    if (/^--/.test(rest)) fail(n, op + ' flags need the CLI (kiln template build)');
    if (/<<-?\s*['"]?\w/.test(rest) && op === 'RUN') fail(n, 'heredocs need the CLI (kiln template build)');
    switch (op) {
      case 'FROM': {
        if (from) fail(n, 'multi-stage builds are not supported (a second FROM)');
        from = true;
        const w = words(rest);
        if (!w.length || (w.length !== 1 && !(w.length === 3 && w[1].toUpperCase() === 'AS'))) fail(n, 'FROM takes an image or template and an optional AS name');
        const ref = w[0];
        if (ref.includes('$')) fail(n, 'FROM with variables needs the CLI');
        if (ref === 'scratch') fail(n, 'FROM scratch is not supported: a template needs a base with a shell');
        const bare = ref.split('@')[0].replace(/:[^/:]*$/, '');
        if (!bare.includes('/') && !ref.includes('@') && isTemplate(bare)) spec.from.template = ref;
        else spec.from.image = ref;
        break;
      }
      case 'RUN': {
        const a = execForm(rest);
        const c = a ? quoteArgs(a) : rest;
        if (!c.trim()) fail(n, 'RUN needs a command');
        spec.steps.push({ type: 'RUN', args: [c], line: n });
        break;
      }
      case 'ENV': {
        const w = words(rest);
        const args = [];
        if (w.length && !w[0].includes('=')) { // legacy: ENV NAME value words
          if (w.length < 2) fail(n, 'ENV needs name=value pairs');
          const v = expand(n, rest.slice(rest.indexOf(w[0]) + w[0].length).trim());
          env[w[0]] = v;
          args.push(w[0], shellWord(v));
        } else {
          for (const pair of w) {
            const i = pair.indexOf('=');
            if (i <= 0) fail(n, 'ENV needs name=value pairs');
            const k = pair.slice(0, i), v = expand(n, pair.slice(i + 1));
            env[k] = v;
            args.push(k, shellWord(v));
          }
        }
        if (!args.length) fail(n, 'ENV needs name=value pairs');
        spec.steps.push({ type: 'ENV', args, line: n });
        break;
      }
      case 'WORKDIR': {
        const w = words(rest);
        if (w.length !== 1) fail(n, 'WORKDIR takes one path');
        const d = expand(n, w[0]);
        if (d.includes(MARK)) fail(n, 'WORKDIR with a variable of the base needs the CLI');
        workdir = clean(d.startsWith('/') || !workdir ? d : workdir + '/' + d);
        spec.steps.push({ type: 'WORKDIR', args: [workdir], line: n });
        break;
      }
      case 'USER': {
        const w = words(rest);
        if (w.length !== 1) fail(n, 'USER takes one user');
        spec.steps.push({ type: 'USER', args: [expand(n, w[0])], line: n });
        break;
      }
      case 'CMD': case 'ENTRYPOINT': {
        const a = execForm(rest);
        const c = a ? { json: true, exec: a } : { json: false, line: words(rest).join(' ') };
        if (op === 'CMD') cmd = c; else entry = c;
        break;
      }
      case 'COPY': case 'ADD':
        fail(n, op + ' needs the build context: build with `kiln template build` or the SDK (BuildDockerfile)');
        break;
      case 'EXPOSE': case 'LABEL': case 'MAINTAINER': case 'STOPSIGNAL': case 'HEALTHCHECK': case 'VOLUME':
        break; // ignored, as the CLI's compiler does (with a warning)
      default: fail(n, op + ' needs the CLI (kiln template build)');
    }
  }
  if (!from) throw new Error('Dockerfile: no FROM instruction');
  const argv = (c) => !c ? [] : c.json ? c.exec : ['/bin/sh', '-c', c.line];
  const startCmd = entry && !entry.json ? entry.line
    : entry ? quoteArgs([...entry.exec, ...argv(cmd)])
      : cmd && !cmd.json ? cmd.line
        : cmd && cmd.exec.length ? quoteArgs(cmd.exec) : '';
  if (startCmd) spec.start_cmd = startCmd;
  return spec;
}

// clean is path.Clean for absolute and relative paths.
function clean(p) {
  const abs = p.startsWith('/');
  const out = [];
  for (const part of p.split('/')) {
    if (part === '' || part === '.') continue;
    if (part === '..') { if (out.length && out[out.length - 1] !== '..') out.pop(); else if (!abs) out.push('..'); } else out.push(part);
  }
  return (abs ? '/' : '') + out.join('/') || (abs ? '/' : '.');
}
