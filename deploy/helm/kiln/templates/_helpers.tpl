{{/* The release's base name. */}}
{{- define "kiln.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "kiln.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* Selector labels of one component (node, front, postgresql). */}}
{{- define "kiln.selector" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "kiln.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* The chart's own Secret: the token, the catalog URL, PostgreSQL's password. */}}
{{- define "kiln.secret" -}}
{{ include "kiln.fullname" . }}-secrets
{{- end -}}

{{- define "kiln.tokenSecret" -}}
{{ .Values.clusterToken.existingSecret | default (include "kiln.secret" .) }}
{{- end -}}

{{- define "kiln.catalogSecret" -}}
{{- if .Values.postgresql.enabled -}}
{{ include "kiln.secret" . }}
{{- else -}}
{{ .Values.catalog.existingSecret | default (include "kiln.secret" .) }}
{{- end -}}
{{- end -}}

{{/* The environment both roles share: the catalog, the token, heartbeats. */}}
{{- define "kiln.clusterEnv" -}}
- name: KILN_STORE
  valueFrom:
    secretKeyRef:
      name: {{ include "kiln.catalogSecret" . }}
      key: url
- name: KILN_CLUSTER_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ include "kiln.tokenSecret" . }}
      key: token
- name: KILN_HEARTBEAT_INTERVAL
  value: {{ .Values.cluster.heartbeatInterval | quote }}
- name: KILN_NODE_LOST_AFTER
  value: {{ .Values.cluster.nodeLostAfter | quote }}
{{- with .Values.domain }}
- name: KILN_DOMAIN
  value: {{ . | quote }}
{{- end }}
{{- end -}}

{{/* node.drainTimeout in whole seconds, rounded up: a Go duration of
integer h, m, s and ms parts (30s, 2m, 1m30s) or 0 (no drain), which kiln
reads as KILN_DRAIN_TIMEOUT; anything else is refused. */}}
{{- define "kiln.drainSeconds" -}}
{{- $d := toString .Values.node.drainTimeout -}}
{{- if not (regexMatch "^(0|([0-9]+(ms|h|m|s))+)$" $d) -}}
{{- fail (printf "node.drainTimeout %q is not a duration such as 30s, 2m or 1m30s (0: no drain)" $d) -}}
{{- end -}}
{{- $ms := 0 -}}
{{- range regexFindAll "[0-9]+(ms|h|m|s)" $d -1 -}}
{{- $n := regexFind "^[0-9]+" . -}}
{{- $unit := trimPrefix $n . -}}
{{- $ms = add $ms (mul ($n | int) (get (dict "h" 3600000 "m" 60000 "s" 1000 "ms" 1) $unit)) -}}
{{- end -}}
{{- div (add $ms 999) 1000 -}}
{{- end -}}

{{/* The node pod's terminationGracePeriodSeconds: longer than the drain,
which must finish before the kubelet's SIGKILL. By default the drain,
then kiln's shutdown grace for in-flight requests (KILN_SHUTDOWN_GRACE,
10 s), plus 5 s. */}}
{{- define "kiln.nodeGrace" -}}
{{- $drain := include "kiln.drainSeconds" . | int -}}
{{- $grace := .Values.node.terminationGracePeriodSeconds -}}
{{- if kindIs "invalid" $grace -}}
{{- add $drain 15 -}}
{{- else if le ($grace | int) $drain -}}
{{- fail (printf "node.terminationGracePeriodSeconds (%v) must be longer than node.drainTimeout (%s, %d s): the kubelet kills the pod at the end of the grace period" $grace .Values.node.drainTimeout $drain) -}}
{{- else -}}
{{- $grace | int -}}
{{- end -}}
{{- end -}}
