{{/*
Names and labels shared by every template of the chart.
*/}}

{{/* The chart name, or nameOverride. */}}
{{- define "rlightning-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The prefix of every object name: fullnameOverride, else the release name with the chart name. */}}
{{- define "rlightning-operator.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* Name of cluster-scoped objects: the full name qualified by the release namespace, so that releases of
the same name in two namespaces do not collide. */}}
{{- define "rlightning-operator.clusterName" -}}
{{- printf "%s-%s" (include "rlightning-operator.fullname" .) .Release.Namespace }}
{{- end }}

{{/* chart label value: name-version. */}}
{{- define "rlightning-operator.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels that select the operator pod; never change between upgrades. */}}
{{- define "rlightning-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "rlightning-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Labels of every object. */}}
{{- define "rlightning-operator.labels" -}}
helm.sh/chart: {{ include "rlightning-operator.chart" . }}
{{ include "rlightning-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: operator
app.kubernetes.io/part-of: rlightning
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* Name of the operator's ServiceAccount. */}}
{{- define "rlightning-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "rlightning-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The subjects of the operator's (Cluster)RoleBindings: its ServiceAccount. */}}
{{- define "rlightning-operator.subjects" -}}
- kind: ServiceAccount
  name: {{ include "rlightning-operator.serviceAccountName" . }}
  namespace: {{ .Release.Namespace }}
{{- end }}

{{/* The image reference; the tag defaults to the chart's appVersion. */}}
{{- define "rlightning-operator.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
