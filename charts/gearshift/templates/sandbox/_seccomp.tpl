{{/*
The sandbox's seccomp profile (values sandbox.seccomp; docs/sandbox.md says why it has its own):
Localhost runs it under the chart's files/sandbox-seccomp.json, which the installer DaemonSet
(seccomp.yaml) writes into every node's <kubeletDir>/seccomp/<localhostProfile>, and for which
the sandbox pod waits; RuntimeDefault under the runtime's default profile.
*/}}

{{/* The sandbox container's seccompProfile. */}}
{{- define "gearshift.sandboxSeccompProfile" -}}
{{- $s := .Values.sandbox.seccomp -}}
{{- if eq $s.profile "Localhost" }}
type: Localhost
localhostProfile: {{ $s.localhostProfile }}
{{- else }}
type: RuntimeDefault
{{- end }}
{{- end }}

{{/* "true" when the chart puts the profile on the nodes (Localhost and the installer on). */}}
{{- define "gearshift.sandboxSeccompInstaller" -}}
{{- $s := .Values.sandbox.seccomp -}}
{{- if and .Values.sandbox.enabled (eq $s.profile "Localhost") $s.installer.enabled }}true{{ end }}
{{- end }}

{{/* The installer's DaemonSet and its ConfigMap (the profile). */}}
{{- define "gearshift.sandboxSeccompName" -}}
{{- include "gearshift.componentName" (dict "root" . "name" "sandbox-seccomp") }}
{{- end }}

{{/* Where the profile lies on a node. */}}
{{- define "gearshift.sandboxSeccompNodePath" -}}
{{- printf "%s/seccomp/%s" (trimSuffix "/" .Values.sandbox.seccomp.installer.kubeletDir) .Values.sandbox.seccomp.localhostProfile }}
{{- end }}

{{/* The profile's file in its ConfigMap, and where the installer and the wait mount them. */}}
{{- define "gearshift.sandboxSeccompFile" -}}sandbox-seccomp.json{{- end }}
{{- define "gearshift.sandboxSeccompProfileDir" -}}/etc/gearshift/seccomp{{- end }}
{{- define "gearshift.sandboxSeccompNodeDir" -}}/host/kubelet-seccomp{{- end }}

{{/* The pod volumes both mount: the ConfigMap and the node's seccomp directory (a YAML list). */}}
{{- define "gearshift.sandboxSeccompVolumes" -}}
- name: seccomp-profile
  configMap:
    name: {{ include "gearshift.sandboxSeccompName" . }}
- name: node-seccomp
  hostPath:
    path: {{ printf "%s/seccomp" (trimSuffix "/" .Values.sandbox.seccomp.installer.kubeletDir) }}
    type: DirectoryOrCreate
{{- end }}

{{/*
The container environment both scripts read (a YAML list): the chart's profile, the node's copy
(through the hostPath) and its path on the node (for their log lines).
*/}}
{{- define "gearshift.sandboxSeccompEnv" -}}
- name: SECCOMP_PROFILE
  value: {{ printf "%s/%s" (include "gearshift.sandboxSeccompProfileDir" .) (include "gearshift.sandboxSeccompFile" .) | quote }}
- name: {{ .target }}
  value: {{ printf "%s/%s" (include "gearshift.sandboxSeccompNodeDir" .root) .root.Values.sandbox.seccomp.localhostProfile | quote }}
- name: SECCOMP_NODE_PATH
  value: {{ include "gearshift.sandboxSeccompNodePath" .root | quote }}
{{- end }}

{{/*
The sandbox pod's init container that waits for the profile on its node (files/seccomp-wait.sh):
the sandbox image, the chart's restricted container settings, the node's directory read-only.
A YAML list, empty unless the installer is on.
*/}}
{{- define "gearshift.sandboxSeccompWait" -}}
{{- if include "gearshift.sandboxSeccompInstaller" . }}
- name: seccomp-wait
  image: {{ include "gearshift.image" (dict "root" . "image" .Values.sandbox.image) }}
  imagePullPolicy: {{ include "gearshift.pullPolicy" (dict "root" . "image" .Values.sandbox.image) }}
  command: ["/bin/sh", "-c", {{ regexReplaceAll "(?m)^#.*\n" (.Files.Get "files/seccomp-wait.sh") "" | quote }}, "seccomp-wait"]
  env:
    {{- include "gearshift.sandboxSeccompEnv" (dict "root" . "target" "SECCOMP_INSTALLED") | nindent 4 }}
  resources:
    {{- toYaml .Values.sandbox.seccomp.installer.resources | nindent 4 }}
  securityContext:
    {{- toYaml .Values.containerSecurityContext | nindent 4 }}
  volumeMounts:
    - name: seccomp-profile
      mountPath: {{ include "gearshift.sandboxSeccompProfileDir" . }}
      readOnly: true
    - name: node-seccomp
      mountPath: {{ include "gearshift.sandboxSeccompNodeDir" . }}
      readOnly: true
{{- end }}
{{- end }}
