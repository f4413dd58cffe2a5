package dockerfile

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/errdefs"
)

// templates are the Kiln templates the tests' IsTemplate knows.
func isTemplate(name string) bool {
	return name == "base" || name == "code-interpreter" || name == "mine"
}

func run(line int, cmd string) api.TemplateStep {
	return api.TemplateStep{Type: api.StepRun, Args: []string{cmd}, Line: line}
}

func cp(line int, args ...string) api.TemplateStep {
	return api.TemplateStep{Type: api.StepCopy, Args: args, Line: line}
}

func step(typ string, line int, args ...string) api.TemplateStep {
	return api.TemplateStep{Type: typ, Args: args, Line: line}
}

func TestCompile(t *testing.T) {
	for _, tc := range []struct {
		name       string
		dockerfile string
		buildArgs  map[string]string
		want       api.TemplateSpec
		warnings   []string // each a substring of one warning, in order
	}{
		{
			name: "E2B's custom package flow",
			dockerfile: `FROM code-interpreter
RUN apt-get update && apt-get install -y cowsay
COPY data.txt /data/
ENV GREETING=hello
WORKDIR /data
`,
			want: api.TemplateSpec{
				From: api.TemplateBase{Template: "code-interpreter"},
				Steps: []api.TemplateStep{
					run(2, "apt-get update && apt-get install -y cowsay"),
					cp(3, "data.txt", "/data/", "", ""),
					step(api.StepEnv, 4, "GREETING", "hello"),
					step(api.StepWorkdir, 5, "/data"),
				},
			},
		},
		{
			name:       "a template with a tag",
			dockerfile: "FROM mine:v2\n",
			want:       api.TemplateSpec{From: api.TemplateBase{Template: "mine:v2"}},
		},
		{
			name:       "a bare name that is no template is an image",
			dockerfile: "FROM python:3.12-slim AS app\n",
			want:       api.TemplateSpec{From: api.TemplateBase{Image: "python:3.12-slim"}},
		},
		{
			name:       "a name with a registry or a path is an image",
			dockerfile: "FROM ghcr.io/acme/mine:v2\n",
			want:       api.TemplateSpec{From: api.TemplateBase{Image: "ghcr.io/acme/mine:v2"}},
		},
		{
			name:       "a digest is an image",
			dockerfile: "FROM mine@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef\n",
			want:       api.TemplateSpec{From: api.TemplateBase{Image: "mine@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"}},
		},
		{
			name:       "ARGs before FROM expand in FROM",
			dockerfile: "ARG REPO=library\nARG TAG=12\nFROM ${REPO}/debian:$TAG\n",
			want:       api.TemplateSpec{From: api.TemplateBase{Image: "library/debian:12"}},
		},
		{
			name:       "a build arg overrides an ARG in FROM",
			dockerfile: "ARG BASE=debian:12\nFROM $BASE\n",
			buildArgs:  map[string]string{"BASE": "base"},
			want:       api.TemplateSpec{From: api.TemplateBase{Template: "base"}},
		},
		{
			name: "ARGs reach RUN as its environment, not the template's",
			dockerfile: `FROM base
ARG VERSION=1.2
ARG EMPTY
ARG QUOTED="a \"b\" $c"
RUN curl -O https://example.com/v$VERSION.tgz
`,
			want: api.TemplateSpec{
				From: api.TemplateBase{Template: "base"},
				Steps: []api.TemplateStep{
					run(5, `export QUOTED="a \"b\" ${c}" VERSION="1.2"; curl -O https://example.com/v$VERSION.tgz`),
				},
			},
		},
		{
			name:       "build args override ARG defaults; an unknown one warns",
			dockerfile: "FROM base\nARG V=1\nRUN echo $V\n",
			buildArgs:  map[string]string{"V": "it's $2", "NOPE": "x"},
			want: api.TemplateSpec{
				From:  api.TemplateBase{Template: "base"},
				Steps: []api.TemplateStep{run(3, `export V="it's \$2"; echo $V`)},
			},
			warnings: []string{"build arg NOPE is not declared"},
		},
		{
			name:       "a bare ARG in the stage takes the global value",
			dockerfile: "ARG V=7\nFROM base\nARG V\nRUN echo $V\n",
			want: api.TemplateSpec{
				From:  api.TemplateBase{Template: "base"},
				Steps: []api.TemplateStep{run(4, `export V="7"; echo $V`)},
			},
		},
		{
			name:       "a global ARG is not in the stage unless declared again",
			dockerfile: "ARG V=7\nFROM base\nRUN echo $V\n",
			want: api.TemplateSpec{
				From:  api.TemplateBase{Template: "base"},
				Steps: []api.TemplateStep{run(3, `echo $V`)},
			},
		},
		{
			name:       "ENV wins over an ARG of the same name",
			dockerfile: "FROM base\nARG X=a\nENV X=b\nRUN echo $X\n",
			want: api.TemplateSpec{
				From:  api.TemplateBase{Template: "base"},
				Steps: []api.TemplateStep{step(api.StepEnv, 3, "X", "b"), run(4, `echo $X`)},
			},
		},
		{
			name: "ENV in both forms, expanded as Docker does",
			dockerfile: `FROM base
ARG PREFIX=/opt
ENV A=1 B="two words" C=$PREFIX/bin
ENV D legacy form $A
ENV PATH=$C:$PATH E='$literal "q" \x'
`,
			want: api.TemplateSpec{
				From: api.TemplateBase{Template: "base"},
				Steps: []api.TemplateStep{
					step(api.StepEnv, 3, "A", "1", "B", "two words", "C", "/opt/bin"),
					step(api.StepEnv, 4, "D", "legacy form 1"),
					step(api.StepEnv, 5, "PATH", "/opt/bin:${PATH}", "E", `\$literal \"q\" \\x`),
				},
			},
		},
		{
			name:       "RUN in exec form is quoted for the shell",
			dockerfile: "FROM base\nRUN [\"echo\", \"a b\", \"it's\", \"$HOME\", \"-n\"]\nRUN [\"if\"]\n",
			want: api.TemplateSpec{
				From:  api.TemplateBase{Template: "base"},
				Steps: []api.TemplateStep{run(2, `echo 'a b' 'it'\''s' '$HOME' -n`), run(3, `'if'`)},
			},
		},
		{
			name:       "continuation lines: the step has the line it starts on",
			dockerfile: "FROM base\n\nRUN apt-get update && \\\n    apt-get install -y \\\n      cowsay\nUSER user\n",
			want: api.TemplateSpec{
				From: api.TemplateBase{Template: "base"},
				Steps: []api.TemplateStep{
					run(3, "apt-get update &&     apt-get install -y       cowsay"),
					step(api.StepUser, 6, "user"),
				},
			},
		},
		{
			name:       "RUN with a heredoc",
			dockerfile: "FROM base\nRUN <<EOF\nset -e\necho one\nEOF\nRUN python3 <<PY\nprint(1)\nPY\n",
			want: api.TemplateSpec{
				From: api.TemplateBase{Template: "base"},
				Steps: []api.TemplateStep{
					run(2, "set -e\necho one\n"),
					run(6, "python3 <<PY\nprint(1)\nPY"),
				},
			},
		},
		{
			name: "WORKDIR is relative to the previous one",
			dockerfile: `FROM base
WORKDIR rel
WORKDIR /app
WORKDIR sub
WORKDIR ../x/
`,
			want: api.TemplateSpec{
				From: api.TemplateBase{Template: "base"},
				Steps: []api.TemplateStep{
					step(api.StepWorkdir, 2, "rel"),
					step(api.StepWorkdir, 3, "/app"),
					step(api.StepWorkdir, 4, "/app/sub"),
					step(api.StepWorkdir, 5, "/app/x"),
				},
			},
		},
		{
			name: "COPY and ADD: flags, several sources, relative destinations",
			dockerfile: `FROM base
ARG OWNER=user
COPY --chown=$OWNER:$OWNER --chmod=755 run.sh /usr/local/bin/run
COPY a.txt ./b/*.py /srv/
WORKDIR /app
COPY ["with space.txt", "."]
ADD ./archive.tar.gz /../abs/../../x/ dest/
COPY /etc/hosts conf/
COPY package.json yarn.lock .
`,
			want: api.TemplateSpec{
				From: api.TemplateBase{Template: "base"},
				Steps: []api.TemplateStep{
					cp(3, "run.sh", "/usr/local/bin/run", "user:user", "0755"),
					cp(4, "a.txt", "/srv/", "", ""),
					cp(4, "b/*.py", "/srv/", "", ""),
					step(api.StepWorkdir, 5, "/app"),
					cp(6, "with space.txt", "/app/", "", ""),
					step(api.StepAdd, 7, "archive.tar.gz", "/app/dest/", "", ""),
					step(api.StepAdd, 7, "x", "/app/dest/", "", ""),
					cp(8, "etc/hosts", "/app/conf/", "", ""),
					cp(9, "package.json", "/app/", "", ""),
					cp(9, "yarn.lock", "/app/", "", ""),
				},
			},
		},
		{
			name:       "after USER, COPY still makes root's files",
			dockerfile: "FROM base\nUSER user\nCOPY a /a\nCOPY --chown=1000 b /b\n",
			want: api.TemplateSpec{
				From: api.TemplateBase{Template: "base"},
				Steps: []api.TemplateStep{
					step(api.StepUser, 2, "user"),
					cp(3, "a", "/a", "0:0", ""),
					cp(4, "b", "/b", "1000", ""),
				},
			},
		},
		{
			name:       "COPY to . with no WORKDIR: a relative directory the engine resolves",
			dockerfile: "FROM base\nCOPY a b .\n",
			want: api.TemplateSpec{
				From:  api.TemplateBase{Template: "base"},
				Steps: []api.TemplateStep{cp(2, "a", "./", "", ""), cp(2, "b", "./", "", "")},
			},
		},
		{
			name:       "COPY --link is ignored with a warning",
			dockerfile: "FROM base\nCOPY --link a /a\n",
			want: api.TemplateSpec{
				From:  api.TemplateBase{Template: "base"},
				Steps: []api.TemplateStep{cp(2, "a", "/a", "", "")},
			},
			warnings: []string{"Dockerfile:2: COPY --link is ignored"},
		},
		{
			name:       "CMD in shell form",
			dockerfile: "FROM base\nCMD python3 -m http.server 8000\n",
			want:       api.TemplateSpec{From: api.TemplateBase{Template: "base"}, StartCmd: "python3 -m http.server 8000"},
		},
		{
			name:       "CMD in exec form, the last one wins",
			dockerfile: "FROM base\nCMD [\"sleep\", \"1\"]\nCMD [\"python3\", \"-c\", \"print('hi')\"]\n",
			want:       api.TemplateSpec{From: api.TemplateBase{Template: "base"}, StartCmd: `python3 -c 'print('\''hi'\'')'`},
		},
		{
			name:       "exec ENTRYPOINT takes exec CMD as arguments",
			dockerfile: "FROM base\nCMD [\"--port\", \"80\"]\nENTRYPOINT [\"/srv/app\", \"serve\"]\n",
			want:       api.TemplateSpec{From: api.TemplateBase{Template: "base"}, StartCmd: "/srv/app serve --port 80"},
		},
		{
			name:       "exec ENTRYPOINT with a shell CMD",
			dockerfile: "FROM base\nENTRYPOINT [\"tini\", \"--\"]\nCMD echo $HOME\n",
			want:       api.TemplateSpec{From: api.TemplateBase{Template: "base"}, StartCmd: "tini -- /bin/sh -c 'echo $HOME'"},
		},
		{
			name:       "shell ENTRYPOINT ignores CMD",
			dockerfile: "FROM base\nENTRYPOINT exec node server.js\nCMD [\"ignored\"]\n",
			want:       api.TemplateSpec{From: api.TemplateBase{Template: "base"}, StartCmd: "exec node server.js"},
		},
		{
			name: "instructions without meaning for a template are ignored with a warning",
			dockerfile: `FROM base
EXPOSE 8080
VOLUME /data
LABEL a=b
HEALTHCHECK --interval=5s CMD curl -f localhost
STOPSIGNAL SIGTERM
MAINTAINER someone
`,
			want: api.TemplateSpec{From: api.TemplateBase{Template: "base"}},
			warnings: []string{
				"Dockerfile:2: EXPOSE is ignored", "Dockerfile:3: VOLUME is ignored", "Dockerfile:4: LABEL is ignored",
				"Dockerfile:5: HEALTHCHECK is ignored", "Dockerfile:6: STOPSIGNAL is ignored", "Dockerfile:7: MAINTAINER is ignored",
			},
		},
		{
			name:       "a variable the Dockerfile does not set expands to empty outside ENV, with a warning",
			dockerfile: "FROM base\nWORKDIR $HOME/app\n",
			want: api.TemplateSpec{
				From:  api.TemplateBase{Template: "base"},
				Steps: []api.TemplateStep{step(api.StepWorkdir, 2, "/app")},
			},
			warnings: []string{"Dockerfile:2: variable HOME is not set by the Dockerfile"},
		},
		{
			name:       "the escape directive",
			dockerfile: "# escape=`\nFROM base\nRUN echo a `\n  b\nCOPY C:\\src /dst\n",
			want: api.TemplateSpec{
				From:  api.TemplateBase{Template: "base"},
				Steps: []api.TemplateStep{run(3, "echo a   b"), cp(5, `C:\src`, "/dst", "", "")},
			},
		},
		{
			name:       "a syntax directive is ignored with a warning",
			dockerfile: "# syntax=docker/dockerfile:1\nFROM base\n",
			want:       api.TemplateSpec{From: api.TemplateBase{Template: "base"}},
			warnings:   []string{"Dockerfile:1: the syntax directive (docker/dockerfile:1) is ignored"},
		},
		{
			name:       "ARG of a platform name without a value warns",
			dockerfile: "FROM base\nARG TARGETARCH\n",
			want:       api.TemplateSpec{From: api.TemplateBase{Template: "base"}},
			warnings:   []string{"Dockerfile:2: ARG TARGETARCH has no value"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec, warnings, err := Compile([]byte(tc.dockerfile), Options{BuildArgs: tc.buildArgs, IsTemplate: isTemplate})
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, *spec); diff != "" {
				t.Errorf("spec (-want +got):\n%s", diff)
			}
			if len(warnings) != len(tc.warnings) {
				t.Fatalf("warnings %q, want %d like %q", warnings, len(tc.warnings), tc.warnings)
			}
			for i, w := range tc.warnings {
				if !strings.Contains(warnings[i], w) {
					t.Errorf("warning %d = %q, want it to contain %q", i, warnings[i], w)
				}
			}
		})
	}
}

func TestCompileRefuses(t *testing.T) {
	for _, tc := range []struct {
		name, dockerfile string
		want             string // a prefix of the error: it names the line
	}{
		{"multi-stage", "FROM base AS build\nRUN make\n\nFROM base\n", "Dockerfile:4: multi-stage builds are not supported"},
		{"COPY --from", "FROM base\nCOPY --from=build /out /out\n", "Dockerfile:2: COPY --from is not supported"},
		{"RUN --mount", "FROM base\nRUN --mount=type=cache,target=/root/.cache pip install x\n", "Dockerfile:2: RUN --mount is not supported"},
		{"RUN --network", "FROM base\n\nRUN --network=none true\n", "Dockerfile:3: RUN --network is not supported"},
		{"RUN --security", "FROM base\nRUN --security=insecure true\n", "Dockerfile:2: RUN --security is not supported"},
		{"several sources into a file", "FROM base\nCOPY a b /dst\n", `Dockerfile:2: COPY with several sources needs a destination directory ending in /, not "/dst"`},
		{"ADD of a URL", "FROM base\nADD https://example.com/x.tgz /x\n", "Dockerfile:2: ADD of a URL (https://example.com/x.tgz) is not supported"},
		{"ADD of a git repository", "FROM base\nADD git@github.com:a/b.git /b\n", "Dockerfile:2: ADD of a URL"},
		{"COPY with a heredoc", "FROM base\nCOPY <<EOF /f\nhi\nEOF\n", "Dockerfile:2: COPY with a heredoc is not supported"},
		{"RUN heredoc with a shebang", "FROM base\nRUN <<EOF\n#!/usr/bin/env python3\nprint(1)\nEOF\n", "Dockerfile:2: RUN with a heredoc that starts with #! is not supported"},
		{"SHELL", "FROM base\nSHELL [\"/bin/bash\", \"-c\"]\n", "Dockerfile:2: SHELL is not supported"},
		{"ONBUILD", "FROM base\nONBUILD RUN true\n", "Dockerfile:2: ONBUILD is not supported"},
		{"unknown instruction", "FROM base\nFETCH x\n", "Dockerfile:2: unknown instruction FETCH"},
		{"instruction before FROM", "ARG A=1\nRUN true\nFROM base\n", "Dockerfile:2: RUN before FROM"},
		{"no FROM", "ARG A=1\n", "Dockerfile:1: no FROM instruction"},
		{"FROM --platform", "FROM --platform=linux/arm64 base\n", "Dockerfile:1: FROM does not support the flag --platform=linux/arm64"},
		{"FROM scratch", "FROM scratch\n", "Dockerfile:1: FROM scratch is not supported"},
		{"FROM with extra words", "FROM base extra\n", "Dockerfile:1: FROM takes an image"},
		{"a source outside the context", "FROM base\nCOPY ../secret /s\n", `Dockerfile:2: COPY source "../secret" is outside the build context`},
		{"a source escaping through a directory", "FROM base\nCOPY a/../../secret /s\n", "Dockerfile:2: COPY source"},
		{"a mode that is not octal", "FROM base\nCOPY --chmod=u+x a /a\n", "Dockerfile:2: COPY --chmod=u+x: only octal modes"},
		{"an unknown COPY flag", "FROM base\nCOPY --parents a /a\n", "Dockerfile:2: COPY --parents is not supported"},
		{"ADD --checksum", "FROM base\nADD --checksum=sha256:00 a /a\n", "Dockerfile:2: ADD --checksum is not supported"},
		{"a flag on ENV", "FROM base\nENV --x=1 A=1\n", "Dockerfile:2: ENV does not support the flag --x=1"},
		{"an empty RUN", "FROM base\nRUN\n", "Dockerfile:2: RUN needs a command"},
		{"COPY without a destination", "FROM base\nCOPY onlyone\n", "Dockerfile:2: COPY needs a source and a destination"},
		{"a WORKDIR of nothing", "FROM base\nWORKDIR $NOPE\n", "Dockerfile:2: WORKDIR needs a path"},
		{"ENV without a value: parse error", "FROM base\nRUN true\nENV ONLYNAME\n", "Dockerfile:3: parsing: ENV must have two arguments"},
		{"exec form of numbers: parse error", "FROM base\nCMD [1, 2]\n", "Dockerfile:2: parsing:"},
		{"unterminated heredoc: parse error", "FROM base\nRUN <<EOF\necho\n", "Dockerfile:2: parsing: unterminated heredoc"},
		{"a bad variable expression", "FROM base\nWORKDIR ${A\n", "Dockerfile:2: "},
		{"empty Dockerfile", "# nothing\n", "Dockerfile:"},
		{"a NUL byte", "FROM base\x00\n", "Dockerfile contains a NUL byte"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec, _, err := Compile([]byte(tc.dockerfile), Options{IsTemplate: isTemplate})
			if err == nil {
				t.Fatalf("compiled to %+v, want an error %q", spec, tc.want)
			}
			if !strings.HasPrefix(err.Error(), tc.want) {
				t.Errorf("error %q, want it to begin %q", err, tc.want)
			}
			if !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Errorf("error %q is not an invalid argument", err)
			}
		})
	}
}
