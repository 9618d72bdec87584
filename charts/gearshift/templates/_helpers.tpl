{{/*
Names, labels and images shared by every template.
*/}}

{{- define "gearshift.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "gearshift.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else if contains (include "gearshift.name" .) .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name (include "gearshift.name" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{/* The name of one component's objects: <fullname>-<component>. Args: root, name. */}}
{{- define "gearshift.componentName" -}}
{{- printf "%s-%s" (include "gearshift.fullname" .root) .name | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Selector labels of one component. Args: root, name. */}}
{{- define "gearshift.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gearshift.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .name }}
{{- end }}

{{/* All labels of one component's objects. Args: root, name. */}}
{{- define "gearshift.labels" -}}
{{ include "gearshift.selectorLabels" . }}
app.kubernetes.io/part-of: gearshift
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" }}
{{- end }}

{{/*
An image reference. Args: root, image (repository, tag, digest). gearshift-* repositories get
.Values.image.registry in front and default to the chart's appVersion; others need their tag.
*/}}
{{- define "gearshift.image" -}}
{{- $repository := .image.repository -}}
{{- $own := hasPrefix "gearshift-" $repository -}}
{{- if and $own .root.Values.image.registry }}
{{- $repository = printf "%s/%s" (trimSuffix "/" .root.Values.image.registry) $repository }}
{{- end }}
{{- $tag := .image.tag | default (ternary (.root.Values.image.tag | default .root.Chart.AppVersion) "" $own) -}}
{{- if .image.digest }}
{{- printf "%s@%s" $repository .image.digest }}
{{- else if $tag }}
{{- printf "%s:%s" $repository $tag }}
{{- else }}
{{- fail (printf "image %s needs a tag or a digest" $repository) }}
{{- end }}
{{- end }}

{{- define "gearshift.pullPolicy" -}}
{{- .image.pullPolicy | default .root.Values.image.pullPolicy }}
{{- end }}

{{- define "gearshift.authSecretName" -}}
{{- .Values.auth.existingSecret | default (printf "%s-auth" (include "gearshift.fullname" .)) }}
{{- end }}

{{/* Secret name and key of the database URL. */}}
{{- define "gearshift.databaseSecretName" -}}
{{- if .Values.postgresql.bundled }}
{{- printf "%s-postgresql" (include "gearshift.fullname" .) }}
{{- else }}
{{- .Values.postgresql.external.existingSecret | default (printf "%s-external-urls" (include "gearshift.fullname" .)) }}
{{- end }}
{{- end }}

{{- define "gearshift.databaseSecretKey" -}}
{{- ternary "database-url" .Values.postgresql.external.secretKey .Values.postgresql.bundled }}
{{- end }}

{{- define "gearshift.redisSecretName" -}}
{{- if .Values.redis.bundled }}
{{- printf "%s-redis" (include "gearshift.fullname" .) }}
{{- else }}
{{- .Values.redis.external.existingSecret | default (printf "%s-external-urls" (include "gearshift.fullname" .)) }}
{{- end }}
{{- end }}

{{- define "gearshift.redisSecretKey" -}}
{{- ternary "redis-url" .Values.redis.external.secretKey .Values.redis.bundled }}
{{- end }}

{{/*
A random secret value that survives upgrades: the value already in the cluster's Secret when
there is one, else a fresh one. Args: root, secret (name), key.
*/}}
{{- define "gearshift.persistentRandom" -}}
{{- $existing := lookup "v1" "Secret" .root.Release.Namespace .secret -}}
{{- if and $existing (index ($existing.data | default dict) .key) }}
{{- index $existing.data .key | b64dec }}
{{- else }}
{{- randAlphaNum 40 }}
{{- end }}
{{- end }}

{{/*
How the worker publishes a checkpoint (GEARSHIFT_ORCHESTRATION__PUBLISH_TARGET): policy.publishTarget,
by default builtin for the built-in server and deployment (a rolling restart) for vLLM.
*/}}
{{- define "gearshift.publishTarget" -}}
{{- $p := .Values.policy -}}
{{- $target := $p.publishTarget | default (ternary "deployment" "builtin" (eq $p.engine "vllm")) -}}
{{- if and $p.enabled (eq $target "vllm_lora") (ne $p.engine "vllm") }}
{{- fail "policy.publishTarget=vllm_lora loads LoRA adapters into vLLM: it needs policy.engine=vllm" }}
{{- end }}
{{- if and $p.enabled (eq $target "builtin") (ne $p.engine "builtin") }}
{{- fail "policy.publishTarget=builtin is the built-in server's /v1/load: with policy.engine=vllm use vllm_lora or deployment" }}
{{- end }}
{{- $target }}
{{- end }}

{{/* "true" when the policy pods mount the checkpoints claim (read-only), else empty. */}}
{{- define "gearshift.policyMountsCheckpoints" -}}
{{- if and .Values.policy.enabled (or .Values.policy.mountCheckpoints (eq (include "gearshift.publishTarget" .) "vllm_lora")) }}true{{ end }}
{{- end }}

{{/* The policy server's base URL (GEARSHIFT_POLICY_CLIENT__URL): https with tls.enabled. */}}
{{- define "gearshift.policyURL" -}}
{{- $port := ternary .Values.policy.vllm.port .Values.policy.builtin.port (eq .Values.policy.engine "vllm") -}}
{{- printf "%s://%s:%v/v1" (include "gearshift.httpScheme" .) (include "gearshift.componentName" (dict "root" . "name" "policy")) $port }}
{{- end }}

{{/*
TLS inside the platform (values `tls`). "true" when tls.enabled, else empty; refuses what cannot
work: TLS without a certificate (no secretName, no certManager), a Certificate without an issuer,
certManager without tls.enabled.
*/}}
{{- define "gearshift.tls" -}}
{{- $tls := .Values.tls -}}
{{- if and $tls.certManager.enabled (not $tls.enabled) }}
{{- fail "tls.certManager.enabled makes the certificate of tls.enabled: set tls.enabled=true too" }}
{{- end }}
{{- if and $tls.certManager.enabled (not $tls.certManager.issuerRef.name) }}
{{- fail "tls.certManager.enabled needs tls.certManager.issuerRef.name (a cert-manager Issuer or ClusterIssuer that writes ca.crt)" }}
{{- end }}
{{- if and $tls.enabled (not $tls.secretName) (not $tls.certManager.enabled) }}
{{- fail "tls.enabled needs a certificate: set tls.secretName (a kubernetes.io/tls Secret with tls.crt, tls.key and ca.crt) or tls.certManager.enabled" }}
{{- end }}
{{- if $tls.enabled }}true{{ end }}
{{- end }}

{{/* http or https: the scheme of the gateway's and the policy server's API. */}}
{{- define "gearshift.httpScheme" -}}
{{- ternary "https" "http" (eq (include "gearshift.tls" .) "true") }}
{{- end }}

{{/* The Secret holding tls.crt, tls.key and ca.crt. */}}
{{- define "gearshift.tlsSecretName" -}}
{{- .Values.tls.secretName | default (printf "%s-internal-tls" (include "gearshift.fullname" .)) }}
{{- end }}

{{/* The name clients check in every server's certificate (GEARSHIFT_TLS__SERVER_NAME). */}}
{{- define "gearshift.tlsServerName" -}}
{{- .Values.tls.serverName | default (printf "%s.%s.svc" (include "gearshift.fullname" .) .Release.Namespace) }}
{{- end }}

{{/* Where every pod that speaks TLS mounts the Secret. */}}
{{- define "gearshift.tlsDir" -}}
/etc/gearshift/tls
{{- end }}

{{/*
The TLS settings of a pod that runs gearshift code (servers and clients both), with tls.enabled;
empty otherwise. A YAML list of EnvVars.
*/}}
{{- define "gearshift.tlsEnv" -}}
{{- if include "gearshift.tls" . }}
{{- $dir := include "gearshift.tlsDir" . -}}
- name: GEARSHIFT_TLS__ENABLED
  value: "true"
- name: GEARSHIFT_TLS__CERT_FILE
  value: {{ printf "%s/tls.crt" $dir | quote }}
- name: GEARSHIFT_TLS__KEY_FILE
  value: {{ printf "%s/tls.key" $dir | quote }}
- name: GEARSHIFT_TLS__CA_FILE
  value: {{ printf "%s/ca.crt" $dir | quote }}
- name: GEARSHIFT_TLS__SERVER_NAME
  value: {{ include "gearshift.tlsServerName" . | quote }}
- name: GEARSHIFT_TLS__CLIENT_AUTH
  value: {{ .Values.tls.clientAuth | toString | quote }}
- name: GEARSHIFT_TLS__HEALTH_PORT
  value: {{ .Values.ports.health | quote }}
{{- end }}
{{- end }}

{{/* The Secret as a pod volume (a YAML list: one volume, or empty without TLS). */}}
{{- define "gearshift.tlsVolumes" -}}
{{- if include "gearshift.tls" . }}
- name: tls
  secret:
    secretName: {{ include "gearshift.tlsSecretName" . }}
{{- end }}
{{- end }}

{{/* Its mount, read-only (a YAML list: one mount, or empty without TLS). */}}
{{- define "gearshift.tlsVolumeMounts" -}}
{{- if include "gearshift.tls" . }}
- name: tls
  mountPath: {{ include "gearshift.tlsDir" . }}
  readOnly: true
{{- end }}
{{- end }}

{{/*
The handler of an HTTP probe on the API port of the gateway or the policy server: httpGet on
`path`, HTTPS with tls.enabled (the kubelet does not verify the certificate). With tls.clientAuth,
a server that requires client certificates (mutual: the policy server, not the gateway) would
refuse the kubelet, which has none: files/probe-https.py then asks from inside the container,
with the pod's certificate. Args: root, path, port (number), mutual (bool), python (the
interpreter of the container's image).
*/}}
{{- define "gearshift.httpProbeHandler" -}}
{{- $root := .root -}}
{{- if and (include "gearshift.tls" $root) $root.Values.tls.clientAuth .mutual }}
{{- $dir := include "gearshift.tlsDir" $root -}}
exec:
  command:
    - {{ .python }}
    - -c
    - {{ $root.Files.Get "files/probe-https.py" | quote }}
    - {{ printf "https://127.0.0.1:%v%s" .port .path | quote }}
    - {{ printf "%s/ca.crt" $dir }}
    - {{ printf "%s/tls.crt" $dir }}
    - {{ printf "%s/tls.key" $dir }}
{{- else }}
httpGet:
  path: {{ .path }}
  port: http
  {{- if include "gearshift.tls" $root }}
  scheme: HTTPS
  {{- end }}
{{- end }}
{{- end }}

{{/*
Environment every platform pod gets: where the other services are, the token, the policy API,
the Redis URL, and the chart-wide `env`. Args: root, database (bool: add the database URL),
dataDir (GEARSHIFT_DATA_DIR, default /var/lib/gearshift).
*/}}
{{- define "gearshift.platformEnv" -}}
{{- $root := .root -}}
- name: GEARSHIFT_HOST
  value: "0.0.0.0"
- name: GEARSHIFT_PORT
  value: {{ $root.Values.ports.grpc | quote }}
- name: GEARSHIFT_METRICS_PORT
  value: {{ $root.Values.ports.metrics | quote }}
- name: GEARSHIFT_DATA_DIR
  value: {{ .dataDir | default "/var/lib/gearshift" | quote }}
{{- range $service := include "gearshift.services" $root | splitList " " }}
- name: GEARSHIFT_{{ upper $service }}_ADDR
  value: {{ include "gearshift.serviceAddress" (dict "root" $root "name" $service) | quote }}
{{- end }}
- name: GEARSHIFT_AUTH_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ include "gearshift.authSecretName" $root }}
      key: {{ $root.Values.auth.secretKey }}
- name: GEARSHIFT_LIMITS__MAX_CONCURRENT_RPCS
  value: {{ $root.Values.limits.maxConcurrentRpcs | quote }}
- name: GEARSHIFT_POLICY_CLIENT__URL
  value: {{ include "gearshift.policyURL" $root | quote }}
- name: GEARSHIFT_POLICY_CLIENT__MODEL
  value: {{ $root.Values.policy.servedModelName | quote }}
- name: GEARSHIFT_POLICY_CLIENT__PROTOCOL
  value: {{ $root.Values.policy.protocol | quote }}
- name: GEARSHIFT_REDIS_URL
  valueFrom:
    secretKeyRef:
      name: {{ include "gearshift.redisSecretName" $root }}
      key: {{ include "gearshift.redisSecretKey" $root }}
{{- if .database }}
- name: GEARSHIFT_DATABASE_URL
  valueFrom:
    secretKeyRef:
      name: {{ include "gearshift.databaseSecretName" $root }}
      key: {{ include "gearshift.databaseSecretKey" $root }}
{{- end }}
{{ include "gearshift.observabilityEnv" $root }}
{{- with include "gearshift.tlsEnv" $root }}
{{ . }}
{{- end }}
{{- range $name, $value := $root.Values.env }}
- name: {{ $name }}
  value: {{ $value | quote }}
{{- end }}
{{- end }}

{{/* Tracing and log settings of every pod that runs gearshift code (platform and policy server). */}}
{{- define "gearshift.observabilityEnv" -}}
- name: GEARSHIFT_LOG_FORMAT
  value: {{ .Values.logs.format | quote }}
- name: GEARSHIFT_GATEWAY__ACCESS_LOG
  value: {{ .Values.logs.accessLog | quote }}
{{- if .Values.tracing.enabled }}
- name: GEARSHIFT_TRACING__ENABLED
  value: "true"
- name: GEARSHIFT_TRACING__OTLP_ENDPOINT
  value: {{ .Values.tracing.otlpEndpoint | quote }}
- name: GEARSHIFT_TRACING__SAMPLE_RATIO
  value: {{ .Values.tracing.sampleRatio | quote }}
{{- end }}
{{- end }}

{{/* A component's own `env` map as EnvVar entries. Args: values. */}}
{{- define "gearshift.componentEnv" -}}
{{- range $name, $value := .values.env }}
- name: {{ $name }}
  value: {{ $value | quote }}
{{- end }}
{{- end }}

{{/* The chart-wide container securityContext with a component's merged over it. Args: root, values. */}}
{{- define "gearshift.containerSecurityContext" -}}
{{- toYaml (mergeOverwrite (deepCopy .root.Values.containerSecurityContext) (deepCopy (.values.securityContext | default dict))) }}
{{- end }}

{{/* Native gRPC probes on the overall health (empty service name) of the standard health service:
on the gRPC port, or with tls.enabled on the plaintext health port (the kubelet speaks no TLS). */}}
{{- define "gearshift.grpcProbes" -}}
{{- $port := ternary .Values.ports.health .Values.ports.grpc (eq (include "gearshift.tls" .) "true") -}}
startupProbe:
  grpc:
    port: {{ $port }}
  periodSeconds: 2
  failureThreshold: 60
livenessProbe:
  grpc:
    port: {{ $port }}
  periodSeconds: 10
  timeoutSeconds: 3
  failureThreshold: 3
readinessProbe:
  grpc:
    port: {{ $port }}
  periodSeconds: 5
  timeoutSeconds: 3
  failureThreshold: 2
{{- end }}

{{/* The platform's gRPC services in start order, then its HTTP ones: the services table of
libs/gearshift/topology.py, split by protocol (tests/charts keeps them the same). */}}
{{- define "gearshift.grpcServices" -}}
store sandbox reward planner router executor
{{- end }}

{{- define "gearshift.httpServices" -}}
gateway
{{- end }}

{{- define "gearshift.services" -}}
{{ include "gearshift.grpcServices" . }} {{ include "gearshift.httpServices" . }}
{{- end }}

{{/* A gRPC service's headless Service: one DNS name for all its ready pods. Args: root, name. */}}
{{- define "gearshift.headlessName" -}}
{{- include "gearshift.componentName" (dict "root" .root "name" (printf "%s-headless" .name)) }}
{{- end }}

{{/* Where in-cluster clients reach a service (GEARSHIFT_<NAME>_ADDR). A gRPC service: the gRPC
target dns:///<headless Service>.<namespace>.svc.<clusterDomain>:<grpc port>, which resolves to
every ready pod, so clients balance their calls over the replicas (round_robin) and re-resolve as
pods come and go. An HTTP service (the gateway): host:port of its ClusterIP Service. Args: root,
name. */}}
{{- define "gearshift.serviceAddress" -}}
{{- $root := .root -}}
{{- if has .name (include "gearshift.httpServices" $root | splitList " ") }}
{{- printf "%s:%v" (include "gearshift.componentName" (dict "root" $root "name" .name)) (index $root.Values .name).port }}
{{- else }}
{{- printf "dns:///%s.%s.svc.%s:%v" (include "gearshift.headlessName" (dict "root" $root "name" .name)) $root.Release.Namespace $root.Values.clusterDomain $root.Values.ports.grpc }}
{{- end }}
{{- end }}

{{/*
What KEDA scales the worker on (gearshift.component's scaleOn): the length of Celery's training
queue. The bundled Redis is read directly (KEDA's redis scaler: the chart knows its address, and
its password Secret authenticates through worker/keda.yaml's TriggerAuthentication); an external
Redis, whose URL only its Secret holds, through the gauge gearshift_celery_queue_length: every
worker reports the same length (LLEN of the list), hence max, not sum.
*/}}
{{- define "gearshift.workerScaleOn" -}}
{{- if .Values.redis.bundled }}
thresholdKey: listLength
trigger:
  type: redis
  metadata:
    address: {{ printf "%s-redis.%s.svc.%s:6379" (include "gearshift.fullname" .) .Release.Namespace .Values.clusterDomain | quote }}
    listName: training
    databaseIndex: "0"
  authenticationRef:
    name: {{ include "gearshift.componentName" (dict "root" . "name" "worker") }}
{{- else }}
trigger:
  type: prometheus
  metricType: AverageValue
  metadata:
    serverAddress: {{ .Values.keda.prometheusServerAddress | quote }}
    query: {{ printf "max(gearshift_celery_queue_length{namespace=%q,service=%q,queue=\"training\"})" .Release.Namespace (include "gearshift.componentName" (dict "root" . "name" "worker")) | quote }}
{{- end }}
{{- end }}

{{/* "true" when KEDA reads the worker's queue in the bundled Redis (its TriggerAuthentication,
and the Redis NetworkPolicy letting the KEDA operator in). */}}
{{- define "gearshift.kedaReadsBundledRedis" -}}
{{- $v := .Values.worker -}}
{{- if and $v.enabled .Values.redis.bundled (include "gearshift.kedaWanted" (dict "root" . "name" "worker" "values" $v "scaleOn" (fromYaml (include "gearshift.workerScaleOn" .)))) }}true{{ end }}
{{- end }}

{{/* The hook events of the store's migration Job (store/migrate-job.yaml says why), "" when off. */}}
{{- define "gearshift.migrationHook" -}}
{{- if and .Values.store.enabled .Values.store.migrations.enabled }}
{{- ternary "pre-upgrade" "pre-install,pre-upgrade" .Values.postgresql.bundled }}
{{- end }}
{{- end }}

{{/*
The environment of a pod that opens the database (store, worker, beat): when the hook Job migrates
it before any pod starts, install included, the pods only check the schema (and refuse to start
on one they do not match) instead of migrating it themselves, unless the values set it.
Args: root, values (the component's values). A YAML list, maybe empty.
*/}}
{{- define "gearshift.migrationEnv" -}}
{{- $own := or (hasKey .root.Values.env "GEARSHIFT_STORE__MIGRATE_ON_START") (hasKey .values.env "GEARSHIFT_STORE__MIGRATE_ON_START") -}}
{{- if and (has "pre-install" (include "gearshift.migrationHook" .root | splitList ",")) (not $own) }}
- name: GEARSHIFT_STORE__MIGRATE_ON_START
  value: "false"
{{- end }}
{{- end }}
