{{/* The name every object starts with: the release's name, with "gpuprobe" in it. */}}
{{- define "gpuprobe.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "gpuprobe.labels" -}}
app.kubernetes.io/name: gpuprobe
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: gpuprobe
{{- end -}}

{{/* The collector Service's name in the cluster's DNS, with the port: what the agents dial first. */}}
{{- define "gpuprobe.collectorAddress" -}}
{{- printf "%s-collector.%s.svc:%d" (include "gpuprobe.fullname" .) .Release.Namespace (int .Values.collector.port) -}}
{{- end -}}

{{/* What the agents' --collector lists: the Service, or each replica under the headless Service. */}}
{{- define "gpuprobe.collectorAddresses" -}}
{{- $fullname := include "gpuprobe.fullname" . -}}
{{- $addresses := list -}}
{{- if .Values.agent.dialReplicas -}}
{{- range $i := until (int .Values.collector.replicas) -}}
{{- $addresses = append $addresses (printf "%s-collector-%d.%s-collector-headless.%s.svc:%d" $fullname $i $fullname $.Release.Namespace (int $.Values.collector.port)) -}}
{{- end -}}
{{- else -}}
{{- $addresses = list (include "gpuprobe.collectorAddress" .) -}}
{{- end -}}
{{- concat $addresses .Values.agent.extraCollectors | join "," -}}
{{- end -}}
