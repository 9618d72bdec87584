{{/*
The one parameterised helper behind every platform component: ServiceAccount, Deployment,
Service, HorizontalPodAutoscaler, PodDisruptionBudget and ServiceMonitor, all from the
component's values (the same sub-keys for every component) plus what only the component
knows (its container's command, ports, probes and volumes).

Args (a dict):
  root            the chart's root context ($)
  name            component name (router, worker, policy, ...)
  values          the component's values (.Values.<name>)
  container       dict: command, args, env, ports, startupProbe, livenessProbe, readinessProbe,
                  lifecycle, volumeMounts (all optional)
  initContainers  list of complete init containers, run before the component's (optional)
  volumes         list of extra pod volumes
  servicePorts    list of Service ports ({name, port, targetPort, appProtocol}); none: no Service
  metricsPort     name of the Service port Prometheus scrapes ("" when there is none)
  automountToken  mount the ServiceAccount token (only the worker, which calls the API server)
  strategy        Deployment strategy (optional)
  podLabels       extra pod labels (optional)
  terminationGracePeriodSeconds  how long a stopping pod may take (optional; Kubernetes: 30)
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
  {{- with .strategy }}
  strategy:
    {{- toYaml . | nindent 4 }}
  {{- end }}
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
      {{- with .terminationGracePeriodSeconds }}
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
      volumes:
        # The root filesystem is read-only: scratch space lives here.
        - name: tmp
          emptyDir:
            sizeLimit: 1Gi
        {{- with .volumes }}
        {{- toYaml . | nindent 8 }}
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
{{- with .servicePorts }}
---
apiVersion: v1
kind: Service
metadata:
  name: {{ $fullname }}
  labels:
    {{- $labels | nindent 4 }}
spec:
  type: ClusterIP
  selector:
    {{- $selector | nindent 4 }}
  ports:
    {{- toYaml . | nindent 4 }}
{{- end }}
{{- if $v.autoscaling.enabled }}
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
{{- end }}
{{- end }}
{{- end }}

{{/*
A gRPC platform service (router, planner, executor, sandbox, reward, store): `gearshift serve
<name>` with native gRPC probes, the gRPC and metrics ports, on the one component helper.
Args: root, name, database (bool: the service gets the database URL).
*/}}
{{- define "gearshift.grpcService" -}}
{{- $root := .root -}}
{{- $v := index $root.Values .name -}}
{{- $env := concat (fromYamlArray (include "gearshift.platformEnv" (dict "root" $root "database" .database))) (fromYamlArray (include "gearshift.componentEnv" (dict "values" $v) | default "[]")) -}}
{{- $probes := fromYaml (include "gearshift.grpcProbes" $root) -}}
{{- $container := dict
  "command" (list "gearshift" "serve" .name)
  "env" $env
  "ports" (list (dict "name" "grpc" "containerPort" $root.Values.ports.grpc "protocol" "TCP") (dict "name" "metrics" "containerPort" $root.Values.ports.metrics "protocol" "TCP"))
  "startupProbe" $probes.startupProbe
  "livenessProbe" $probes.livenessProbe
  "readinessProbe" $probes.readinessProbe
  "volumeMounts" (list (dict "name" "data" "mountPath" "/var/lib/gearshift"))
-}}
{{- $servicePorts := list
  (dict "name" "grpc" "port" $root.Values.ports.grpc "targetPort" "grpc" "protocol" "TCP" "appProtocol" "grpc")
  (dict "name" "metrics" "port" $root.Values.ports.metrics "targetPort" "metrics" "protocol" "TCP")
-}}
{{- $volumes := list (dict "name" "data" "emptyDir" (dict "sizeLimit" "1Gi")) -}}
{{- include "gearshift.component" (dict "root" $root "name" .name "values" $v "container" $container "volumes" $volumes "servicePorts" $servicePorts "metricsPort" "metrics") }}
{{- end }}
