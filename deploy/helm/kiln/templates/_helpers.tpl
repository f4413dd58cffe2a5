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
