{{/* The checkpoints claim's name (existing or chart-created). */}}
{{- define "gearshift.checkpointsClaim" -}}
{{- .Values.training.checkpoints.existingClaim | default (include "gearshift.componentName" (dict "root" . "name" "checkpoints")) }}
{{- end }}

{{/*
Whole CPUs in a CPU quantity ("4", 4, "2.5", "500m"), rounded down; 0 when it cannot be read.
*/}}
{{- define "gearshift.wholeCPUs" -}}
{{- $quantity := toString . -}}
{{- if regexMatch "^[0-9]+(\\.[0-9]+)?$" $quantity }}
{{- $quantity | float64 | floor | int }}
{{- else if regexMatch "^[0-9]+m$" $quantity }}
{{- div (trimSuffix "m" $quantity | atoi) 1000 }}
{{- else }}
{{- 0 }}
{{- end }}
{{- end }}

{{/*
The environment torchrun's processes need, under training.env (which wins). OMP_NUM_THREADS:
the CPU limit shared by the processes (torchrun would set 1, starving a lone CPU process).
TORCH_NCCL_ASYNC_ERROR_HANDLING: when a rank dies the others fail fast instead of hanging in a
collective. Args: values (training), processes, cpu (the CPU limit).
*/}}
{{- define "gearshift.trainingEnv" -}}
{{- $cpus := include "gearshift.wholeCPUs" .cpu | atoi -}}
{{- $env := dict "OMP_NUM_THREADS" (max 1 (div $cpus .processes)) -}}
{{- if gt (int .values.gpus) 0 }}
{{- $_ := set $env "NCCL_DEBUG" "WARN" }}
{{- $_ := set $env "TORCH_NCCL_ASYNC_ERROR_HANDLING" "1" }}
{{- end }}
{{- range $name, $value := .values.env }}
{{- $_ := set $env $name $value }}
{{- end }}
{{- include "gearshift.componentEnv" (dict "values" (dict "env" $env)) }}
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
{{- $processes := max $gpus 1 -}}
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
          {{- include "gearshift.trainingEnv" (dict "values" $t "processes" $processes "cpu" (dig "limits" "cpu" "" $resources)) | nindent 10 }}
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
      # torch DataLoader workers and NCCL share tensors through /dev/shm; unset: 2Gi per process.
      - name: dshm
        emptyDir:
          medium: Memory
          sizeLimit: {{ $t.shmSize | default (printf "%dGi" (mul 2 $processes)) }}
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
