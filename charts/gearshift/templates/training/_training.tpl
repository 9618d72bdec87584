{{/* The checkpoints claim's name (existing or chart-created). */}}
{{- define "gearshift.checkpointsClaim" -}}
{{- .Values.training.checkpoints.existingClaim | default (include "gearshift.componentName" (dict "root" . "name" "checkpoints")) }}
{{- end }}

{{/*
The Job spec of one training run: `gearshift train <algorithm> --config <file>` (under torchrun
when training.gpus > 1), checkpoints on the shared claim, GPUs from training.gpus.
Args: root, algorithm, configMap (holds config.yaml), ttl (bool: delete the Job after it ends).
*/}}
{{- define "gearshift.trainingJobSpec" -}}
{{- $root := .root -}}
{{- $t := $root.Values.training -}}
{{- $gpus := int $t.gpus -}}
{{- $resources := deepCopy $t.resources -}}
{{- if gt $gpus 0 }}
{{- $_ := set $resources "limits" (merge (dict "nvidia.com/gpu" $gpus) ($resources.limits | default dict)) }}
{{- end }}
{{- $labels := include "gearshift.labels" (dict "root" $root "name" "training") -}}
backoffLimit: {{ $t.backoffLimit }}
activeDeadlineSeconds: {{ $t.activeDeadlineSeconds }}
{{- if .ttl }}
ttlSecondsAfterFinished: {{ $t.ttlSecondsAfterFinished }}
{{- end }}
template:
  metadata:
    labels:
      {{- $labels | nindent 6 }}
  spec:
    restartPolicy: Never
    automountServiceAccountToken: false
    enableServiceLinks: false
    securityContext:
      {{- toYaml $root.Values.podSecurityContext | nindent 6 }}
    {{- with $root.Values.imagePullSecrets }}
    imagePullSecrets:
      {{- toYaml . | nindent 6 }}
    {{- end }}
    containers:
      - name: train
        image: {{ include "gearshift.image" (dict "root" $root "image" $t.image) }}
        imagePullPolicy: {{ include "gearshift.pullPolicy" (dict "root" $root "image" $t.image) }}
        {{- if gt $gpus 1 }}
        command: ["torchrun", "--standalone", "--nproc-per-node", {{ $gpus | quote }}, "-m", "gearshift.cli", "train"]
        {{- else }}
        command: ["gearshift", "train"]
        {{- end }}
        args: [{{ .algorithm | quote }}, "--config", "/etc/gearshift/train/config.yaml"]
        env:
          {{- include "gearshift.platformEnv" (dict "root" $root "database" true "dataDir" $t.checkpoints.mountPath) | nindent 10 }}
          - name: USER
            value: gearshift
          {{- with include "gearshift.componentEnv" (dict "values" $t) | trim }}
          {{- . | nindent 10 }}
          {{- end }}
        {{- with $t.envFromSecret }}
        envFrom:
          - secretRef:
              name: {{ . }}
        {{- end }}
        resources:
          {{- toYaml $resources | nindent 10 }}
        securityContext:
          {{- include "gearshift.containerSecurityContext" (dict "root" $root "values" dict) | nindent 10 }}
        volumeMounts:
          - name: tmp
            mountPath: /tmp
          - name: dshm
            mountPath: /dev/shm
          - name: checkpoints
            mountPath: {{ $t.checkpoints.mountPath }}
          - name: config
            mountPath: /etc/gearshift/train
            readOnly: true
    volumes:
      - name: tmp
        emptyDir:
          sizeLimit: 10Gi
      # torch DataLoader workers and NCCL share tensors through /dev/shm.
      - name: dshm
        emptyDir:
          medium: Memory
          sizeLimit: {{ $t.shmSize }}
      - name: checkpoints
        persistentVolumeClaim:
          claimName: {{ include "gearshift.checkpointsClaim" $root }}
      - name: config
        configMap:
          name: {{ .configMap }}
    {{- with $t.nodeSelector }}
    nodeSelector:
      {{- toYaml . | nindent 6 }}
    {{- end }}
    {{- with $t.tolerations }}
    tolerations:
      {{- toYaml . | nindent 6 }}
    {{- end }}
    {{- with $t.affinity }}
    affinity:
      {{- toYaml . | nindent 6 }}
    {{- end }}
{{- end }}

{{/*
The ConfigMap holding one run's --config file. Every job's config needs output.dir and reads and
registers through the store: unless the values say otherwise, the run writes to
<checkpoints mountPath>/<run> on the claim and talks to this release's store.
Args: root, name, run (the run's name), config.
*/}}
{{- define "gearshift.trainingConfigMap" -}}
{{- $defaults := dict
  "output" (dict "dir" (printf "%s/%s" .root.Values.training.checkpoints.mountPath .run))
  "store_addr" (printf "%s:%v" (include "gearshift.componentName" (dict "root" .root "name" "store")) .root.Values.ports.grpc)
-}}
{{- $config := merge (deepCopy (.config | default dict)) $defaults -}}
apiVersion: v1
kind: ConfigMap
metadata:
  name: {{ .name }}
  labels:
    {{- include "gearshift.labels" (dict "root" .root "name" "training") | nindent 4 }}
data:
  config.yaml: |
    {{- toYaml $config | nindent 4 }}
{{- end }}
