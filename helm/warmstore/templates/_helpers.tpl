{{- define "warmstore.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "warmstore.fullname" -}}
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

{{- define "warmstore.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "warmstore.selectorLabels" -}}
app.kubernetes.io/name: {{ include "warmstore.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "warmstore.labels" -}}
helm.sh/chart: {{ include "warmstore.chart" . }}
{{ include "warmstore.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "warmstore.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "warmstore.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- /* Standbys on one node defeat their purpose: spread the pods over nodes, softly by default.
Used only when .Values.affinity is empty. */ -}}
{{- define "warmstore.podAntiAffinity" -}}
{{- if eq .Values.podAntiAffinityPreset "soft" -}}
podAntiAffinity:
  preferredDuringSchedulingIgnoredDuringExecution:
    - weight: 100
      podAffinityTerm:
        topologyKey: kubernetes.io/hostname
        labelSelector:
          matchLabels:
            {{- include "warmstore.selectorLabels" . | nindent 12 }}
{{- else if eq .Values.podAntiAffinityPreset "hard" -}}
podAntiAffinity:
  requiredDuringSchedulingIgnoredDuringExecution:
    - topologyKey: kubernetes.io/hostname
      labelSelector:
        matchLabels:
          {{- include "warmstore.selectorLabels" . | nindent 10 }}
{{- end }}
{{- end -}}

{{- /* The image to run: by digest when one is given, else by tag. No public image exists, so the
repository must be given. */ -}}
{{- define "warmstore.image" -}}
{{- $repository := required "image.repository is required: build deploy/Dockerfile and push it to a registry the cluster pulls from (see the chart README, section The image)" .Values.image.repository -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" $repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" $repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}
{{- end -}}

{{- /* volumeClaimTemplates cannot change on an installed StatefulSet; say so before Kubernetes
refuses the upgrade half-way. */ -}}
{{- define "warmstore.checkImmutableVolumes" -}}
{{- $existing := lookup "apps/v1" "StatefulSet" .Release.Namespace (include "warmstore.fullname" .) -}}
{{- if and $existing .Values.persistence.enabled -}}
{{- range $existing.spec.volumeClaimTemplates -}}
{{- if eq .metadata.name "state" -}}
{{- $size := .spec.resources.requests.storage -}}
{{- if ne (toString $size) (toString $.Values.persistence.size) -}}
{{- fail (printf "persistence.size cannot change from %v to %v on an installed StatefulSet; to grow the volumes, follow the chart README, section Growing the volumes" $size $.Values.persistence.size) -}}
{{- end -}}
{{- $class := .spec.storageClassName | default "" -}}
{{- if and $.Values.persistence.storageClass (ne $class $.Values.persistence.storageClass) -}}
{{- fail (printf "persistence.storageClass cannot change from %q to %q on an installed StatefulSet; to move, follow the chart README, section Moving to another storage class" $class $.Values.persistence.storageClass) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
