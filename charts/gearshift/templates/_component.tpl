{{/*
The one parameterised helper behind every platform component: ServiceAccount, Deployment,
Service (and a headless one), HorizontalPodAutoscaler or KEDA ScaledObject, PodDisruptionBudget
and ServiceMonitor, all from the component's values (the same sub-keys for every component) plus
what only the component knows (its container's command, ports, probes and volumes, how it
drains, what measures its load).

Args (a dict):
  root            the chart's root context ($)
  name            component name (router, worker, policy, ...)
  values          the component's values (.Values.<name>)
  container       dict: command, args, env, ports, startupProbe, livenessProbe, readinessProbe,
                  lifecycle, volumeMounts (all optional)
  initContainers  list of complete init containers, run before the component's (optional)
  volumes         list of extra pod volumes
  servicePorts    list of Service ports ({name, port, targetPort, appProtocol}); none: no Service
  serviceType     that Service's type (optional; default ClusterIP)
  headlessPorts   list of ports of a headless Service <name>-headless beside it, whose DNS name
                  resolves to every ready pod (gRPC clients balance calls over them); none: none
  metricsPort     name of the Service port Prometheus scrapes ("" when there is none)
  metricsTLS      that port is the API's, under TLS with tls.enabled (the policy server): the
                  ServiceMonitor scrapes it over HTTPS with the CA (and, with tls.clientAuth, the
                  certificate) of the TLS Secret; the other metrics ports stay plaintext
  automountToken  mount the ServiceAccount token (only the worker, which calls the API server)
  strategy        Deployment strategy (optional; default: roll with a surge pod and none
                  unavailable, so a rollout never lowers the capacity)
  podLabels       extra pod labels (optional)
  drain           the pod serves requests that must finish: a preStop sleep of preStopSeconds
                  (unless container.lifecycle is given) lets the endpoints drop it, then the
                  process drains for GEARSHIFT_GRACE_SECONDS, what terminationGracePeriodSeconds
                  leaves after the sleep and a 5 s margin (unless env sets it)
  scaleOn         what KEDA scales the component on (autoscaling.keda): dict with `metric` (a
                  Prometheus series the component exports, summed over this release's pods as its
                  ServiceMonitor labels them) or `trigger` (a complete KEDA trigger; its metadata's
                  threshold key `thresholdKey`, default threshold); none: KEDA is refused
With tls.enabled every component's pod mounts the TLS Secret (gearshift.tlsVolumes) into its
container; its env (gearshift.tlsEnv) is the template's to give.
*/}}
{{- define "gearshift.component" -}}
{{- $root := .root -}}
{{- $name := .name -}}
{{- $v := .values -}}
{{- if $v.enabled }}
{{- $fullname := include "gearshift.componentName" (dict "root" $root "name" $name) -}}
{{- $labels := include "gearshift.labels" (dict "root" $root "name" $name) -}}
{{- $selector := include "gearshift.selectorLabels" (dict "root" $root "name" $name) -}}
{{- $container := .container | default dict -}}
{{- if .drain }}
{{- $preStop := int $root.Values.preStopSeconds -}}
{{- if not $container.lifecycle }}
{{- $_ := set $container "lifecycle" (dict "preStop" (dict "sleep" (dict "seconds" $preStop))) }}
{{- end }}
{{- $env := $container.env | default list -}}
{{- $named := list -}}
{{- range $env }}{{ $named = append $named .name }}{{ end }}
{{- if not (has "GEARSHIFT_GRACE_SECONDS" $named) }}
{{- $grace := max 1 (sub (int $v.terminationGracePeriodSeconds) (add $preStop 5)) -}}
{{- $_ := set $container "env" (append $env (dict "name" "GEARSHIFT_GRACE_SECONDS" "value" (toString $grace))) }}
{{- end }}
{{- end }}
{{- $strategy := .strategy | default (dict "type" "RollingUpdate" "rollingUpdate" (dict "maxSurge" 1 "maxUnavailable" 0)) -}}
{{- $keda := include "gearshift.kedaWanted" (dict "root" $root "name" $name "values" $v "scaleOn" .scaleOn) -}}
{{- $pdbWanted := and $v.pdb.enabled (or (gt (int $v.replicaCount) 1) $v.autoscaling.enabled) -}}
{{- if and $v.serviceMonitor.enabled (not .metricsPort) }}
{{- fail (printf "%s.serviceMonitor: %s exposes no metrics port" $name $name) }}
{{- end }}
---
apiVersion: v1
kind: ServiceAccount
metadata:
  name: {{ $fullname }}
  labels:
    {{- $labels | nindent 4 }}
automountServiceAccountToken: {{ .automountToken | default false }}
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ $fullname }}
  labels:
    {{- $labels | nindent 4 }}
spec:
  {{- if not $v.autoscaling.enabled }}
  replicas: {{ $v.replicaCount }}
  {{- end }}
  revisionHistoryLimit: 5
  strategy:
    {{- toYaml $strategy | nindent 4 }}
  selector:
    matchLabels:
      {{- $selector | nindent 6 }}
  template:
    metadata:
      labels:
        {{- $labels | nindent 8 }}
        {{- with .podLabels }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      {{- with $v.podAnnotations }}
      annotations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
    spec:
      serviceAccountName: {{ $fullname }}
      automountServiceAccountToken: {{ .automountToken | default false }}
      enableServiceLinks: false
      {{- with $v.runtimeClassName }}
      runtimeClassName: {{ . }}
      {{- end }}
      {{- if and (hasKey $v "hostUsers") (not $v.hostUsers) }}
      hostUsers: false
      {{- end }}
      securityContext:
        {{- toYaml $root.Values.podSecurityContext | nindent 8 }}
      {{- with $root.Values.imagePullSecrets }}
      imagePullSecrets:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $v.priorityClassName }}
      priorityClassName: {{ . }}
      {{- end }}
      {{- with $v.terminationGracePeriodSeconds }}
      terminationGracePeriodSeconds: {{ . }}
      {{- end }}
      {{- with .initContainers }}
      initContainers:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      containers:
        - name: {{ $name }}
          image: {{ include "gearshift.image" (dict "root" $root "image" $v.image) }}
          imagePullPolicy: {{ include "gearshift.pullPolicy" (dict "root" $root "image" $v.image) }}
          {{- with $container.command }}
          command:
            {{- toYaml . | nindent 12 }}
          {{- end }}
          {{- with $container.args }}
          args:
            {{- toYaml . | nindent 12 }}
          {{- end }}
          {{- with $container.ports }}
          ports:
            {{- toYaml . | nindent 12 }}
          {{- end }}
          {{- with $container.env }}
          env:
            {{- toYaml . | nindent 12 }}
          {{- end }}
          {{- with $v.envFromSecret }}
          # Secret settings (API keys, ...): every key of this Secret becomes a variable.
          envFrom:
            - secretRef:
                name: {{ . }}
          {{- end }}
          {{- range $field := list "startupProbe" "livenessProbe" "readinessProbe" "lifecycle" }}
          {{- with index $container $field }}
          {{ $field }}:
            {{- toYaml . | nindent 12 }}
          {{- end }}
          {{- end }}
          resources:
            {{- toYaml $v.resources | nindent 12 }}
          securityContext:
            {{- include "gearshift.containerSecurityContext" (dict "root" $root "values" $v) | nindent 12 }}
          volumeMounts:
            - name: tmp
              mountPath: /tmp
            {{- with $container.volumeMounts }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
            {{- with include "gearshift.tlsVolumeMounts" $root }}
            {{- . | nindent 12 }}
            {{- end }}
      volumes:
        # The root filesystem is read-only: scratch space lives here.
        - name: tmp
          emptyDir:
            sizeLimit: 1Gi
        {{- with .volumes }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
        {{- with include "gearshift.tlsVolumes" $root }}
        {{- . | nindent 8 }}
        {{- end }}
      {{- with $v.nodeSelector }}
      nodeSelector:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $v.tolerations }}
      tolerations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      affinity:
        {{- if $v.affinity }}
        {{- toYaml $v.affinity | nindent 8 }}
        {{- else }}
        # Default: spread replicas over nodes when the scheduler can.
        podAntiAffinity:
          preferredDuringSchedulingIgnoredDuringExecution:
            - weight: 100
              podAffinityTerm:
                topologyKey: kubernetes.io/hostname
                labelSelector:
                  matchLabels:
                    {{- $selector | nindent 20 }}
        {{- end }}
      {{- with $v.topologySpreadConstraints }}
      topologySpreadConstraints:
        {{- range . }}
        {{- $constraint := deepCopy . }}
        {{- if not (hasKey $constraint "labelSelector") }}
        {{- $_ := set $constraint "labelSelector" (dict "matchLabels" (fromYaml $selector)) }}
        {{- end }}
        - {{- toYaml $constraint | nindent 10 }}
        {{- end }}
      {{- end }}
{{- with .servicePorts }}
---
apiVersion: v1
kind: Service
metadata:
  name: {{ $fullname }}
  labels:
    {{- $labels | nindent 4 }}
spec:
  type: {{ $.serviceType | default "ClusterIP" }}
  selector:
    {{- $selector | nindent 4 }}
  ports:
    {{- toYaml . | nindent 4 }}
{{- end }}
{{- with .headlessPorts }}
---
# One DNS name for every ready pod: gRPC clients resolve it (dns:///) and balance calls over the
# pods round_robin; a pod leaves the answers as it stops being ready. It has no metrics port, so
# the ServiceMonitor, whose selector matches it too, scrapes nothing twice.
apiVersion: v1
kind: Service
metadata:
  name: {{ include "gearshift.headlessName" (dict "root" $root "name" $name) }}
  labels:
    {{- $labels | nindent 4 }}
spec:
  clusterIP: None
  publishNotReadyAddresses: false
  selector:
    {{- $selector | nindent 4 }}
  ports:
    {{- toYaml . | nindent 4 }}
{{- end }}
{{- if $keda }}
{{- include "gearshift.scaledObject" (dict "root" $root "name" $name "values" $v "scaleOn" .scaleOn) }}
{{- else if $v.autoscaling.enabled }}
---
apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata:
  name: {{ $fullname }}
  labels:
    {{- $labels | nindent 4 }}
spec:
  scaleTargetRef:
    apiVersion: apps/v1
    kind: Deployment
    name: {{ $fullname }}
  minReplicas: {{ $v.autoscaling.minReplicas }}
  maxReplicas: {{ $v.autoscaling.maxReplicas }}
  metrics:
    {{- with $v.autoscaling.targetCPUUtilizationPercentage }}
    - type: Resource
      resource:
        name: cpu
        target:
          type: Utilization
          averageUtilization: {{ . }}
    {{- end }}
    {{- with $v.autoscaling.targetMemoryUtilizationPercentage }}
    - type: Resource
      resource:
        name: memory
        target:
          type: Utilization
          averageUtilization: {{ . }}
    {{- end }}
  {{- with $v.autoscaling.behavior }}
  behavior:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end }}
{{- if $pdbWanted }}
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: {{ $fullname }}
  labels:
    {{- $labels | nindent 4 }}
spec:
  {{- if $v.pdb.minAvailable }}
  minAvailable: {{ $v.pdb.minAvailable }}
  {{- else }}
  maxUnavailable: {{ $v.pdb.maxUnavailable | default 1 }}
  {{- end }}
  selector:
    matchLabels:
      {{- $selector | nindent 6 }}
{{- end }}
{{- if $v.serviceMonitor.enabled }}
---
apiVersion: monitoring.coreos.com/v1
kind: ServiceMonitor
metadata:
  name: {{ $fullname }}
  labels:
    {{- $labels | nindent 4 }}
    {{- with $v.serviceMonitor.labels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
spec:
  selector:
    matchLabels:
      {{- $selector | nindent 6 }}
  endpoints:
    - port: {{ .metricsPort }}
      path: /metrics
      interval: {{ $v.serviceMonitor.interval }}
      scrapeTimeout: {{ $v.serviceMonitor.scrapeTimeout }}
      {{- if and .metricsTLS (include "gearshift.tls" $root) }}
      {{- $secret := include "gearshift.tlsSecretName" $root }}
      scheme: https
      tlsConfig:
        serverName: {{ include "gearshift.tlsServerName" $root }}
        ca:
          secret:
            name: {{ $secret }}
            key: ca.crt
        {{- if $root.Values.tls.clientAuth }}
        cert:
          secret:
            name: {{ $secret }}
            key: tls.crt
        keySecret:
          name: {{ $secret }}
          key: tls.key
        {{- end }}
      {{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/*
A gRPC platform service (router, planner, executor, sandbox, reward, store): `gearshift serve
<name>` with native gRPC probes, the gRPC and metrics ports (and with tls.enabled the plaintext
health port the probes use), a headless Service for the gRPC port, and a drain on stop, on the
one component helper.
Args: root, name, database (bool: the service gets the database URL), env (extra variables,
before the component's own), metric (the Prometheus series KEDA scales it on; none: none),
volumes and volumeMounts (the service's own, beside the data emptyDir; none: none),
initContainers (none: none), values (the component's values as the template completed them;
none: .Values.<name>).
*/}}
{{- define "gearshift.grpcService" -}}
{{- $root := .root -}}
{{- $v := .values | default (index $root.Values .name) -}}
{{- $env := concat (fromYamlArray (include "gearshift.platformEnv" (dict "root" $root "database" .database))) (.env | default list) (fromYamlArray (include "gearshift.componentEnv" (dict "values" $v) | default "[]")) -}}
{{- $probes := fromYaml (include "gearshift.grpcProbes" $root) -}}
{{- $ports := list (dict "name" "grpc" "containerPort" $root.Values.ports.grpc "protocol" "TCP") (dict "name" "metrics" "containerPort" $root.Values.ports.metrics "protocol" "TCP") -}}
{{- if include "gearshift.tls" $root }}
{{- /* The plaintext grpc.health.v1 port the probes use (in no Service: only the kubelet asks it). */ -}}
{{- $ports = append $ports (dict "name" "grpc-health" "containerPort" $root.Values.ports.health "protocol" "TCP") }}
{{- end }}
{{- $container := dict
  "command" (list "gearshift" "serve" .name)
  "env" $env
  "ports" $ports
  "startupProbe" $probes.startupProbe
  "livenessProbe" $probes.livenessProbe
  "readinessProbe" $probes.readinessProbe
  "volumeMounts" (concat (list (dict "name" "data" "mountPath" "/var/lib/gearshift")) (.volumeMounts | default list))
-}}
{{- $grpcPort := dict "name" "grpc" "port" $root.Values.ports.grpc "targetPort" "grpc" "protocol" "TCP" "appProtocol" "grpc" -}}
{{- $servicePorts := list $grpcPort (dict "name" "metrics" "port" $root.Values.ports.metrics "targetPort" "metrics" "protocol" "TCP") -}}
{{- $volumes := concat (list (dict "name" "data" "emptyDir" (dict "sizeLimit" "1Gi"))) (.volumes | default list) -}}
{{- $scaleOn := dict -}}
{{- with .metric }}{{ $scaleOn = dict "metric" . }}{{ end }}
{{- include "gearshift.component" (dict "root" $root "name" .name "values" $v "container" $container "volumes" $volumes "servicePorts" $servicePorts "headlessPorts" (list $grpcPort) "metricsPort" "metrics" "drain" true "scaleOn" $scaleOn "initContainers" .initContainers) }}
{{- end }}

{{/*
"true" when the component scales with a KEDA ScaledObject: autoscaling.keda.enabled and a cluster
that serves keda.sh/v1alpha1 (elsewhere the HPA stands in). Refuses what cannot work: KEDA
without autoscaling, a component with nothing to scale on, a Prometheus metric nobody scrapes.
Args: root, name, values, scaleOn (see gearshift.component).
*/}}
{{- define "gearshift.kedaWanted" -}}
{{- $a := .values.autoscaling -}}
{{- if and .values.enabled $a.keda.enabled }}
{{- if not $a.enabled }}
{{- fail (printf "%s.autoscaling.keda.enabled needs %s.autoscaling.enabled (KEDA takes minReplicas, maxReplicas and behavior from it)" .name .name) }}
{{- end }}
{{- if not .scaleOn }}
{{- fail (printf "%s.autoscaling.keda: the %s has no load metric for KEDA to scale on; autoscale it on CPU (keda.enabled=false)" .name .name) }}
{{- end }}
{{- if and .scaleOn.metric (not .values.serviceMonitor.enabled) }}
{{- fail (printf "%s.autoscaling.keda scales on %s, which Prometheus has only with %s.serviceMonitor.enabled" .name .scaleOn.metric .name) }}
{{- end }}
{{- if kindIs "invalid" $a.keda.threshold }}
{{- fail (printf "%s.autoscaling.keda needs a threshold (the load per replica to aim at)" .name) }}
{{- end }}
{{- if .root.Capabilities.APIVersions.Has "keda.sh/v1alpha1/ScaledObject" }}true{{ end }}
{{- end }}
{{- end }}

{{/*
A KEDA ScaledObject for a component's Deployment: its autoscaling's replica bounds and behavior,
one trigger on its load (scaleOn). KEDA makes and owns the HPA. A metric is summed over this
release's pods, as their ServiceMonitor labels the series (namespace, service).
Args: root, name, values, scaleOn.
*/}}
{{- define "gearshift.scaledObject" -}}
{{- $root := .root -}}
{{- $a := .values.autoscaling -}}
{{- $fullname := include "gearshift.componentName" (dict "root" $root "name" .name) -}}
{{- $threshold := toString $a.keda.threshold -}}
{{- $trigger := dict -}}
{{- if .scaleOn.metric }}
{{- $query := printf "sum(%s{namespace=%q,service=%q})" .scaleOn.metric $root.Release.Namespace $fullname -}}
{{- $trigger = dict "type" "prometheus" "metricType" "AverageValue" "metadata" (dict "serverAddress" $root.Values.keda.prometheusServerAddress "query" $query "threshold" $threshold) -}}
{{- else }}
{{- $trigger = deepCopy .scaleOn.trigger -}}
{{- $_ := set $trigger.metadata (.scaleOn.thresholdKey | default "threshold") $threshold -}}
{{- end }}
---
apiVersion: keda.sh/v1alpha1
kind: ScaledObject
metadata:
  name: {{ $fullname }}
  labels:
    {{- include "gearshift.labels" (dict "root" $root "name" .name) | nindent 4 }}
spec:
  scaleTargetRef:
    apiVersion: apps/v1
    kind: Deployment
    name: {{ $fullname }}
  minReplicaCount: {{ $a.minReplicas }}
  maxReplicaCount: {{ $a.maxReplicas }}
  {{- with $a.behavior }}
  advanced:
    horizontalPodAutoscalerConfig:
      behavior:
        {{- toYaml . | nindent 8 }}
  {{- end }}
  triggers:
    - {{- toYaml $trigger | nindent 6 }}
{{- end }}
