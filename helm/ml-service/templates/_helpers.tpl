{{/*
Names, labels and the decisions that several templates share. Each decision lives here once.
*/}}

{{- define "ml-service.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Name prefix of every object: <release>-<chart>, or <release> when that already holds the chart name.
Truncated to 50 characters so that "<prefix>-logic-<hash>-<hash>" pod names stay valid.
*/}}
{{- define "ml-service.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 50 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 50 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 50 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "ml-service.logicName" -}}
{{- printf "%s-logic" (include "ml-service.fullname" .) }}
{{- end }}

{{- define "ml-service.modelName" -}}
{{- printf "%s-model" (include "ml-service.fullname" .) }}
{{- end }}

{{- define "ml-service.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels of every object; call with (dict "root" $ "component" "logic"|"model"|""). */}}
{{- define "ml-service.labels" -}}
helm.sh/chart: {{ include "ml-service.chart" .root }}
{{ include "ml-service.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/part-of: {{ include "ml-service.fullname" .root }}
{{- with .root.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Selector labels; call with (dict "root" $ "component" "logic"|"model"). */}}
{{- define "ml-service.selectorLabels" -}}
app.kubernetes.io/name: {{ include "ml-service.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
{{- if .component }}
app.kubernetes.io/component: {{ .component }}
{{- end }}
{{- end }}

{{- define "ml-service.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "ml-service.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
An image reference; call with (dict "root" $ "image" <repository/tag map> "registry" true|false).
The tag defaults to the chart's appVersion; "latest" is refused (schema and here).
*/}}
{{- define "ml-service.image" -}}
{{- $tag := toString (default .root.Chart.AppVersion .image.tag) }}
{{- if eq $tag "latest" }}
{{- fail (printf "image %s: the tag \"latest\" is not allowed; pin a version" .image.repository) }}
{{- end }}
{{- $repository := .image.repository }}
{{- if and .registry .root.Values.imageRegistry }}
{{- $repository = printf "%s/%s" (trimSuffix "/" .root.Values.imageRegistry) $repository }}
{{- end }}
{{- printf "%s:%s" $repository $tag }}
{{- end }}

{{- define "ml-service.logicImage" -}}
{{- include "ml-service.image" (dict "root" . "image" .Values.logic.image "registry" true) }}
{{- end }}

{{/* The model server's image: Triton's, or modelsvc's CPU or GPU build. */}}
{{- define "ml-service.modelImage" -}}
{{- if eq .Values.model.server "triton" }}
{{- include "ml-service.image" (dict "root" . "image" .Values.model.triton.image "registry" false) }}
{{- else if .Values.gpu.enabled }}
{{- include "ml-service.image" (dict "root" . "image" .Values.model.modelsvc.gpuImage "registry" true) }}
{{- else }}
{{- include "ml-service.image" (dict "root" . "image" .Values.model.modelsvc.image "registry" true) }}
{{- end }}
{{- end }}

{{- define "ml-service.repositoryImage" -}}
{{- include "ml-service.image" (dict "root" . "image" .Values.modelRepository.image "registry" true) }}
{{- end }}

{{/*
The autoscaling engine: "keda", "hpa", or "" (autoscaling off). "auto" asks the cluster (or, under
`helm template`, the --api-versions given) whether it serves KEDA's ScaledObject.
*/}}
{{- define "ml-service.autoscalingEngine" -}}
{{- if .Values.autoscaling.enabled }}
{{- if eq .Values.autoscaling.engine "auto" }}
{{- if .Capabilities.APIVersions.Has "keda.sh/v1alpha1/ScaledObject" }}keda{{ else }}hpa{{ end }}
{{- else }}
{{- .Values.autoscaling.engine }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Grace period of a half: preStop sleep + the server's drain bound + a margin. Call with the half's drain map.
*/}}
{{- define "ml-service.terminationGracePeriod" -}}
{{- add .drain.preStopSleepSeconds (include "ml-service.exitTimeout" .) .drain.marginSeconds }}
{{- end }}

{{/*
A half's drain bound (--exit-timeout-secs): its drain.exitTimeoutSeconds, raised to service.yaml's
model_service.timeout_s when that is longer, so a request waiting on the model at SIGTERM (the logic half) or
a model call still in flight (the model half) is never cut. Call with (dict "root" $ "drain" $half.drain).
*/}}
{{- define "ml-service.exitTimeout" -}}
{{- $bound := int .drain.exitTimeoutSeconds }}
{{- if .root.Values.logic.serviceYaml }}
{{- $timeout := dig "model_service" "timeout_s" 0 (fromYaml .root.Values.logic.serviceYaml) }}
{{- $bound = max $bound (ceil (float64 $timeout) | int) }}
{{- end }}
{{- $bound }}
{{- end }}

{{/* modelsvc's --workers for the model pod: a count as given, or for auto the CPU request's (none at 2 CPUs or
fewer, else one per whole CPU but the engine's); auto again when the container requests no CPU (modelsvc then
reads its CPU limit). Call with the model map. */}}
{{- define "ml-service.modelWorkers" -}}
{{- $cpu := dig "requests" "cpu" "" (default (dict) .resources) | toString }}
{{- if ne (toString .workers) "auto" }}
{{- .workers }}
{{- else if not $cpu }}
{{- "auto" }}
{{- else }}
{{- $millis := ternary (trimSuffix "m" $cpu | float64) (mulf (float64 $cpu) 1000) (hasSuffix "m" $cpu) }}
{{- if le $millis 2000.0 }}0{{ else }}{{ sub (floor (divf $millis 1000) | int) 1 }}{{ end }}
{{- end }}
{{- end }}

{{/* The preStop hook of a half; call with the half's drain map. `sleep` is in every image (coreutils, busybox). */}}
{{- define "ml-service.preStop" -}}
preStop:
  exec:
    command: ["sleep", "{{ .preStopSleepSeconds }}"]
{{- end }}

{{/* Whether the model pods get a memory-backed /dev/shm: "true" or "". */}}
{{- define "ml-service.sharedMemory" -}}
{{- $enabled := toString .Values.model.sharedMemory.enabled }}
{{- if or (eq $enabled "true") (and (eq $enabled "auto") (eq .Values.model.server "triton")) }}true{{ end }}
{{- end }}

{{/* The headless Service of the model pods (clusterIP: None): its DNS name answers every ready pod's address. */}}
{{- define "ml-service.modelHeadlessName" -}}
{{- printf "%s-headless" (include "ml-service.modelName" . | trunc 54 | trimSuffix "-") }}
{{- end }}

{{/* The URL the logic server calls the model service at (same namespace: the short name resolves). With
     logic.modelDiscovery dns it names the headless Service, whose name the logic server resolves to the pods. */}}
{{- define "ml-service.modelUrl" -}}
{{- $host := ternary (include "ml-service.modelHeadlessName" .) (include "ml-service.modelName" .) (eq .Values.logic.modelDiscovery "dns") }}
{{- if eq .Values.logic.modelProtocol "grpc" }}
{{- printf "grpc://%s:8001" $host }}
{{- else }}
{{- printf "http://%s:8000" $host }}
{{- end }}
{{- end }}

{{/* PromQL label matchers for a half's series; call with (dict "root" $ "half" "logic"|"model"). */}}
{{- define "ml-service.promSelector" -}}
{{- $prom := .root.Values.autoscaling.keda.prometheus }}
{{- $given := ternary $prom.logicSelector $prom.modelSelector (eq .half "logic") }}
{{- if $given }}
{{- tpl $given .root }}
{{- else }}
{{- $pods := ternary (include "ml-service.logicName" .root) (include "ml-service.modelName" .root) (eq .half "logic") }}
{{- printf "namespace=\"%s\",pod=~\"%s-.*\"" .root.Release.Namespace $pods }}
{{- end }}
{{- end }}

{{/* A PodDisruptionBudget's budget; call with the half's pdb map. */}}
{{- define "ml-service.pdbBudget" -}}
{{- if not (kindIs "invalid" .minAvailable) }}
minAvailable: {{ .minAvailable }}
{{- else }}
maxUnavailable: {{ .maxUnavailable }}
{{- end }}
{{- end }}

{{/* Default topology spread of a half: over nodes, best effort. Call with (dict "root" $ "component" ...). */}}
{{- define "ml-service.topologySpread" -}}
- maxSkew: 1
  topologyKey: kubernetes.io/hostname
  whenUnsatisfiable: ScheduleAnyway
  labelSelector:
    matchLabels:
      {{- include "ml-service.selectorLabels" . | nindent 6 }}
{{- end }}

{{/* Pod-level security context of a half; Triton's image needs its uid set. Call with (dict "root" $ "triton" bool). */}}
{{- define "ml-service.podSecurityContext" -}}
{{- $ctx := deepCopy .root.Values.podSecurityContext }}
{{- if .triton }}
{{- $_ := set $ctx "runAsUser" .root.Values.model.triton.runAsUser }}
{{- $_ := set $ctx "runAsGroup" .root.Values.model.triton.runAsUser }}
{{- end }}
{{- toYaml $ctx }}
{{- end }}

{{/* The probes of a container; call with (dict "probes" <timing map> "startup" path "liveness" path "readiness" path "port" name). */}}
{{- define "ml-service.probes" -}}
startupProbe:
  httpGet:
    path: {{ .startup }}
    port: {{ .port }}
  {{- toYaml .probes.startup | nindent 2 }}
livenessProbe:
  httpGet:
    path: {{ .liveness }}
    port: {{ .port }}
  {{- toYaml .probes.liveness | nindent 2 }}
readinessProbe:
  httpGet:
    path: {{ .readiness }}
    port: {{ .port }}
  {{- toYaml .probes.readiness | nindent 2 }}
{{- end }}

{{/*
Checks across values that the schema cannot express; each fails with a message that names the keys.
*/}}
{{- define "ml-service.validate" -}}
{{- $repo := .Values.modelRepository }}
{{- if and (eq $repo.source "pvc") (not $repo.pvc.claimName) }}
{{- fail "modelRepository.source is pvc: set modelRepository.pvc.claimName" }}
{{- end }}
{{- if and (eq $repo.source "url") (not $repo.url) }}
{{- fail "modelRepository.source is url: set modelRepository.url (s3://bucket/prefix, gs://..., az://...)" }}
{{- end }}
{{- if and (ne $repo.source "url") $repo.url }}
{{- fail (printf "modelRepository.url is set but modelRepository.source is %s: set source: url, or unset url" $repo.source) }}
{{- end }}
{{- if and (eq $repo.source "url") (eq .Values.model.server "triton") }}
{{- range $repo.env }}
{{- if hasPrefix "AWS_ENDPOINT_URL" .name }}
{{- fail (printf "modelRepository.env: Triton reads no %s; put the endpoint in modelRepository.url as Triton's s3://host:port/bucket/prefix (modelsvc reads that form too)" .name) }}
{{- end }}
{{- end }}
{{- end }}
{{- if .Values.logic.serviceYaml }}
{{- $parsed := fromYaml .Values.logic.serviceYaml }}
{{- if hasKey $parsed "Error" }}
{{- fail (printf "logic.serviceYaml is not valid YAML: %s" (get $parsed "Error")) }}
{{- end }}
{{- if not (and (hasKey $parsed "name") (hasKey $parsed "service")) }}
{{- fail "logic.serviceYaml must be a service.yaml: a mapping with at least name and service" }}
{{- end }}
{{- end }}
{{- if and .Values.autoscaling.enabled (eq (include "ml-service.autoscalingEngine" .) "keda") }}
{{- $l := .Values.logic.autoscaling.keda }}
{{- if not (or $l.requestRate.enabled $l.cpu.enabled) }}
{{- fail "logic.autoscaling.keda: enable requestRate or cpu (KEDA needs at least one trigger)" }}
{{- end }}
{{- $m := .Values.model.autoscaling.keda }}
{{- if not (or $m.queueTime.enabled $m.pendingRequests.enabled $m.cpu.enabled (and .Values.gpu.enabled $m.gpuUtilization.enabled)) }}
{{- fail "model.autoscaling.keda: enable queueTime, pendingRequests, cpu or (with gpu.enabled) gpuUtilization (KEDA needs at least one trigger)" }}
{{- end }}
{{- if and $l.cpu.enabled (not (dig "requests" "cpu" "" .Values.logic.resources)) }}
{{- fail "logic.autoscaling.keda.cpu needs logic.resources.requests.cpu (utilization is a share of the request)" }}
{{- end }}
{{- if and $m.cpu.enabled (not (dig "requests" "cpu" "" .Values.model.resources)) }}
{{- fail "model.autoscaling.keda.cpu needs model.resources.requests.cpu (utilization is a share of the request)" }}
{{- end }}
{{- end }}
{{- if and .Values.autoscaling.enabled (eq (include "ml-service.autoscalingEngine" .) "hpa") }}
{{- if not (dig "requests" "cpu" "" .Values.logic.resources) }}
{{- fail "the HPA scales the logic pods on CPU: set logic.resources.requests.cpu" }}
{{- end }}
{{- if not (dig "requests" "cpu" "" .Values.model.resources) }}
{{- fail "the HPA scales the model pods on CPU: set model.resources.requests.cpu" }}
{{- end }}
{{- end }}
{{- range $half := list "logic" "model" }}
{{- $a := (get $.Values $half).autoscaling }}
{{- if and $.Values.autoscaling.enabled (gt (int $a.minReplicas) (int $a.maxReplicas)) }}
{{- fail (printf "%s.autoscaling.minReplicas (%d) is above maxReplicas (%d)" $half (int $a.minReplicas) (int $a.maxReplicas)) }}
{{- end }}
{{- end }}
{{- end }}
