{{/* The prefix of this chart's own objects: the release name, so that two releases differ. */}}
{{- define "gpuspawner.fullname" -}}
{{- printf "%s-gpuspawner" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end }}

{{- define "gpuspawner.labels" -}}
app.kubernetes.io/name: gpuspawner
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end }}

{{/* z2jh's hub ServiceAccount (hub.serviceAccount.name; "hub" unless the admin renames it). */}}
{{- define "gpuspawner.hubServiceAccount" -}}
{{- $hub := (.Values.jupyterhub.hub | default dict) -}}
{{- (($hub.serviceAccount | default dict).name) | default "hub" -}}
{{- end }}

{{- define "gpuspawner.hubSubject" -}}
- kind: ServiceAccount
  name: {{ include "gpuspawner.hubServiceAccount" . }}
  namespace: {{ .Release.Namespace }}
{{- end }}

{{/* The catalog's distinct images, sorted: the pre-puller pulls each once. */}}
{{- define "gpuspawner.catalogImages" -}}
{{- $images := list -}}
{{- range $key, $spec := .Values.gpuspawner.catalog.images -}}
{{- $images = append $images $spec.image -}}
{{- end -}}
{{- $images | uniq | sortAlpha | toJson -}}
{{- end }}
