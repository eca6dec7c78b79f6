{{/* The chart's name, or nameOverride. */}}
{{- define "outbox-relay.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The objects' name: the release's, with the chart's unless it holds it. */}}
{{- define "outbox-relay.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The labels every object has; component is passed as .component. */}}
{{- define "outbox-relay.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .ctx.Chart.Name .ctx.Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "outbox-relay.selectorLabels" . }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
app.kubernetes.io/part-of: outbox-relay
{{- end -}}

{{- define "outbox-relay.selectorLabels" -}}
app.kubernetes.io/name: {{ include "outbox-relay.name" .ctx | quote }}
app.kubernetes.io/instance: {{ .ctx.Release.Name | quote }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* The migration's objects' name: within 63 characters, as the Job's pods carry it in a label. */}}
{{- define "outbox-relay.migrateName" -}}
{{- printf "%s-migrate" (include "outbox-relay.fullname" . | trunc 55 | trimSuffix "-") -}}
{{- end -}}

{{- define "outbox-relay.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ default .Chart.AppVersion .Values.image.tag }}
{{- end -}}
{{- end -}}

{{- define "outbox-relay.secretName" -}}
{{- default (include "outbox-relay.fullname" .) .Values.secret.existingSecret -}}
{{- end -}}

{{/* relay.yaml: the configuration given, with the listeners and TLS the chart sets. */}}
{{- define "outbox-relay.config" -}}
{{- $admin := dict "listen" (printf ":%d" (int .Values.ports.admin)) "api_listen" "" -}}
{{- if .Values.ports.api -}}
{{- $_ := set $admin "api_listen" (printf ":%d" (int .Values.ports.api)) -}}
{{- end -}}
{{- if .Values.tls.existingSecret -}}
{{- $_ := set $admin "tls" (dict "cert_file" "/etc/outbox-relay/tls/tls.crt" "key_file" "/etc/outbox-relay/tls/tls.key") -}}
{{- end -}}
{{- $cfg := mustMergeOverwrite (deepCopy .Values.config) (dict "admin" $admin) -}}
{{- toYaml $cfg -}}
{{- end -}}

{{/* The pods' configuration: relay.yaml, the Secret's keys and the TLS pair in one read-only directory. .configMap and .secret name their sources. */}}
{{- define "outbox-relay.configVolume" -}}
- name: config
  projected:
    defaultMode: 0440
    sources:
      - configMap:
          name: {{ .configMap }}
          items:
            - key: relay.yaml
              path: relay.yaml
      - secret:
          name: {{ .secret }}
          items:
            {{- range .ctx.Values.secret.keys }}
            - key: {{ . }}
              path: secrets/{{ . }}
            {{- end }}
      {{- with .ctx.Values.tls.existingSecret }}
      - secret:
          name: {{ . }}
          items:
            - key: tls.crt
              path: tls/tls.crt
            - key: tls.key
              path: tls/tls.key
      {{- end }}
{{- end -}}

{{/* The pods' security and placement, shared by the relay and the migration. */}}
{{- define "outbox-relay.podCommon" -}}
automountServiceAccountToken: false
{{- with .Values.serviceAccountName }}
serviceAccountName: {{ . }}
{{- end }}
securityContext:
  {{- toYaml .Values.podSecurityContext | nindent 2 }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with .Values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{- define "outbox-relay.probe" -}}
httpGet:
  path: {{ .path }}
  port: admin
  {{- if .ctx.Values.tls.existingSecret }}
  scheme: HTTPS
  {{- end }}
{{- toYaml .timing | nindent 0 }}
{{- end -}}
