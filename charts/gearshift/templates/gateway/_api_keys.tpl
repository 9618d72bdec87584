{{/* The Secret holding the gateway's client API keys file; empty when no keys are configured
(the platform token then stays the one client key). */}}
{{- define "gearshift.apiKeysSecretName" -}}
{{- $keys := .Values.gateway.apiKeys -}}
{{- if $keys.existingSecret }}
{{- $keys.existingSecret }}
{{- else if $keys.keys }}
{{- include "gearshift.componentName" (dict "root" . "name" "api-keys") }}
{{- end }}
{{- end }}
