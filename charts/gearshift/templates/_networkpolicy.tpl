{{/*
Who may connect to whom, with networkPolicy.enabled: each component's callers, read from the
code (the clients each service, job and the policy's init container opens). One table, so that
a new client is one word here; tests/charts/test_network_policies.py checks it against the
rendered policies. The helm test's pod (health-check) checks every platform service.
*/}}
{{- define "gearshift.callers" -}}
executor: [gateway, worker, training, health-check]
router: [executor, worker, health-check]
planner: [executor, health-check]
reward: [executor, gateway, worker, training, health-check]
store: [executor, gateway, router, worker, training, policy, health-check]
policy: [executor, router, planner, reward, sandbox, worker, training]
postgresql: [store, store-migrate, worker, beat, training]
redis: [worker, beat]
{{- end }}

{{/* NetworkPolicy peers: this release's pods of the components that call `name`. Args: root, name. */}}
{{- define "gearshift.callerPeers" -}}
{{- $root := .root -}}
{{- range index (fromYaml (include "gearshift.callers" $root)) .name }}
- podSelector:
    matchLabels:
      {{- include "gearshift.selectorLabels" (dict "root" $root "name" .) | nindent 6 }}
{{- end }}
{{- end }}

{{/* Egress rules every pod whose egress is fenced needs: the cluster DNS (networkPolicy.dnsPeers)
on UDP and TCP 53, and with tracing on the collector (networkPolicy.collectorPeers) on
tracing.otlpEndpoint's port. Args: root. */}}
{{- define "gearshift.platformEgress" -}}
- to:
    {{- toYaml .Values.networkPolicy.dnsPeers | nindent 4 }}
  ports:
    - port: 53
      protocol: UDP
    - port: 53
      protocol: TCP
{{- if .Values.tracing.enabled }}
- to:
    {{- toYaml .Values.networkPolicy.collectorPeers | nindent 4 }}
  ports:
    - port: {{ include "gearshift.collectorPort" . }}
      protocol: TCP
{{- end }}
{{- end }}

{{/* The port of tracing.otlpEndpoint (its scheme's when it names none). */}}
{{- define "gearshift.collectorPort" -}}
{{- $host := (urlParse .Values.tracing.otlpEndpoint).host -}}
{{- if contains ":" $host }}{{ last (splitList ":" $host) }}{{ else }}{{ ternary 443 80 (hasPrefix "https:" .Values.tracing.otlpEndpoint) }}{{ end }}
{{- end }}

{{/* Prometheus as a NetworkPolicy peer: pods of networkPolicy.metricsNamespaceSelector's
namespaces, only those of networkPolicy.metricsPodSelector when that is set. */}}
{{- define "gearshift.metricsPeer" -}}
- namespaceSelector:
    {{- toYaml .Values.networkPolicy.metricsNamespaceSelector | nindent 4 }}
  {{- with .Values.networkPolicy.metricsPodSelector }}
  podSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end }}

{{/*
A component's NetworkPolicy: `port` (a named port) from its callers in the table above, when it
has a row, and its metrics port from Prometheus when it serves one. Args: root, name, port
(empty: no callers, as the worker and beat, which only connect out), metrics (bool).
*/}}
{{- define "gearshift.networkPolicy" -}}
{{- $root := .root -}}
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  name: {{ include "gearshift.componentName" (dict "root" $root "name" .name) }}
  labels:
    {{- include "gearshift.labels" (dict "root" $root "name" .name) | nindent 4 }}
spec:
  podSelector:
    matchLabels:
      {{- include "gearshift.selectorLabels" (dict "root" $root "name" .name) | nindent 6 }}
  policyTypes: [Ingress]
  ingress:
    {{- if .port }}
    - from:
        {{- include "gearshift.callerPeers" (dict "root" $root "name" .name) | nindent 8 }}
      ports:
        - port: {{ .port }}
          protocol: TCP
    {{- end }}
    {{- if .metrics }}
    - from:
        {{- include "gearshift.metricsPeer" $root | nindent 8 }}
      ports:
        - port: metrics
          protocol: TCP
    {{- end }}
    {{- if not (or .port .metrics) }} []{{ end }}
{{- end }}
