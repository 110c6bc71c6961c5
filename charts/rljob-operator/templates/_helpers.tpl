{{/* Chart name, truncated to 63 characters. */}}
{{- define "rljob-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name: the release name, unless it already contains the chart name. */}}
{{- define "rljob-operator.fullname" -}}
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

{{- define "rljob-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "rljob-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "rljob-operator.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "rljob-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "rljob-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "rljob-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "rljob-operator.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* The namespaces whose RLJobs are watched: the listed ones, or none (= the whole cluster). */}}
{{- define "rljob-operator.namespaces" -}}
{{- if eq .Values.watch.scope "namespaces" }}{{ join "," .Values.watch.namespaces }}{{ end }}
{{- end }}

{{/*
The operator's permissions, least privilege: RLJobs (kopf keeps its bookkeeping in annotations,
status is written through the subresource), Events, and exactly the verbs it uses on each child
kind: server-side apply (create, patch) and get; list/watch for the kinds its informers cache
(RayClusters, Jobs, pods); get on the claims the jobs mount (their access modes); delete only for the
pools and the driver it tears down on suspend.
Creating the jobs' Roles needs the permissions they grant (configmaps get, pods get/list/watch),
which this rule set holds.
*/}}
{{/* The operator's pods as a NetworkPolicy peer: they poll each job's ControlService. */}}
{{- define "rljob-operator.operatorPeers" -}}
{{- $peer := dict "namespaceSelector" (dict "matchLabels" (dict "kubernetes.io/metadata.name" .Release.Namespace)) "podSelector" (dict "matchLabels" (include "rljob-operator.selectorLabels" . | fromYaml)) -}}
{{- list $peer | toJson -}}
{{- end }}

{{/* The metrics scrapers as NetworkPolicy peers: the pod selector in the namespace selector, either one
alone (null: left out; {} selects all), or none when both are null. */}}
{{- define "rljob-operator.scraperPeers" -}}
{{- $peer := dict -}}
{{- with .Values.networkPolicy -}}
{{- if not (kindIs "invalid" .scrapeNamespaceSelector) }}{{ $_ := set $peer "namespaceSelector" .scrapeNamespaceSelector }}{{ end -}}
{{- if not (kindIs "invalid" .scrapePodSelector) }}{{ $_ := set $peer "podSelector" .scrapePodSelector }}{{ end -}}
{{- end -}}
{{- if $peer }}{{ list $peer | toJson }}{{ else }}[]{{ end -}}
{{- end }}

{{- /* Exactly operator/rljob_operator/kube/rights.py's RIGHTS (tests/operator/test_operator_chart.py checks it). */}}
{{- define "rljob-operator.rules" -}}
- apiGroups: [rljob.io]
  resources: [rljobs]
  verbs: [list, watch, patch]
- apiGroups: [rljob.io]
  resources: [rljobs/status]
  verbs: [patch]
- apiGroups: [rljob.io]
  resources: [rljobs/finalizers]
  verbs: [update]
- apiGroups: [""]
  resources: [events]
  verbs: [create]
{{- /* the job's token; patch only to add Ray's key to one an older operator made */}}
- apiGroups: [""]
  resources: [secrets]
  verbs: [create, get, patch]
- apiGroups: [""]
  resources: [configmaps]
  verbs: [get, create, patch]
- apiGroups: [""]
  resources: [services, serviceaccounts]
  verbs: [get, create, patch]
{{- /* only to delete an older operator's driver Role and RoleBinding, where they are the job's */}}
- apiGroups: [rbac.authorization.k8s.io]
  resources: [roles, rolebindings]
  verbs: [get, delete]
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [get, create, patch]
- apiGroups: [ray.io]
  resources: [rayclusters]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [batch]
  resources: [jobs]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [""]
  resources: [pods]
  verbs: [list, watch]
- apiGroups: [""]
  resources: [persistentvolumeclaims]
  verbs: [get]
{{- end }}
