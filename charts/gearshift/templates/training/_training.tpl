{{/* The checkpoints claim's name (existing or chart-created). */}}
{{- define "gearshift.checkpointsClaim" -}}
{{- .Values.training.checkpoints.existingClaim | default (include "gearshift.componentName" (dict "root" . "name" "checkpoints")) }}
{{- end }}

{{/*
The checkpoints claim's access modes as a YAML list. More than one pod may use the claim at once
when training spans nodes or the policy server reads checkpoints that training writes; pods on
different nodes then need ReadWriteMany. Empty training.checkpoints.accessModes: ReadWriteMany in
those cases, else ReadWriteOnce; modes given without ReadWriteMany in those cases are refused.
(Concurrent one-pod runs, worker.concurrency > 1, share a ReadWriteOnce claim on one node.)
*/}}
{{- define "gearshift.checkpointsAccessModes" -}}
{{- $modes := .Values.training.checkpoints.accessModes | default list -}}
{{- $sharers := list -}}
{{- if gt (int .Values.training.nodes) 1 }}
{{- $sharers = append $sharers (printf "training on %d nodes" (int .Values.training.nodes)) }}
{{- end }}
{{- if include "gearshift.policyMountsCheckpoints" . }}
{{- $sharers = append $sharers "the policy server reading checkpoints" }}
{{- end }}
{{- if not $modes }}
{{- $modes = list (ternary "ReadWriteMany" "ReadWriteOnce" (gt (len $sharers) 0)) }}
{{- else if and $sharers (not (has "ReadWriteMany" $modes)) }}
{{- fail (printf "training.checkpoints.accessModes %v: the claim is used by pods on several nodes (%s), which needs ReadWriteMany (leave accessModes empty to get it)" $modes (join ", " $sharers)) }}
{{- end }}
{{- toYaml $modes }}
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
collective. NCCL's network variables from training.network.nccl, those given.
Args: values (training), processes, cpu (the CPU limit).
*/}}
{{- define "gearshift.trainingEnv" -}}
{{- $cpus := include "gearshift.wholeCPUs" .cpu | atoi -}}
{{- $env := dict "OMP_NUM_THREADS" (max 1 (div $cpus .processes)) -}}
{{- if gt (int .values.gpus) 0 }}
{{- $_ := set $env "NCCL_DEBUG" "WARN" }}
{{- $_ := set $env "TORCH_NCCL_ASYNC_ERROR_HANDLING" "1" }}
{{- end }}
{{- $nccl := dict "socketIfname" "NCCL_SOCKET_IFNAME" "ibHca" "NCCL_IB_HCA" "ibGidIndex" "NCCL_IB_GID_INDEX" "ibDisable" "NCCL_IB_DISABLE" "netGdrLevel" "NCCL_NET_GDR_LEVEL" }}
{{- range $key, $value := (dig "network" "nccl" dict .values) }}
{{- if and (toString $value) (hasKey $nccl $key) }}
{{- $_ := set $env (get $nccl $key) (toString $value) }}
{{- end }}
{{- end }}
{{- range $name, $value := .values.env }}
{{- $_ := set $env $name $value }}
{{- end }}
{{- include "gearshift.componentEnv" (dict "values" (dict "env" $env)) }}
{{- end }}

{{/*
What a training pod is made of under either launcher, from the training values: the processes
per pod (GPUs, at least one), resources (GPUs in the limits, RDMA devices in both), the train
container's env, security context (IPC_LOCK for RDMA when asked) and volume mounts, and the pod's volumes (the run's config from configMap, checkpoints on the shared
claim, /tmp and /dev/shm as emptyDirs, with tls.enabled the TLS Secret). Args: root, configMap.
*/}}
{{- define "gearshift.trainingPodParts" -}}
{{- $root := .root -}}
{{- $t := $root.Values.training -}}
{{- $gpus := int $t.gpus -}}
{{- $processes := max $gpus 1 -}}
{{- $resources := deepCopy $t.resources -}}
{{- if gt $gpus 0 }}
{{- $_ := set $resources "limits" (merge (dict "nvidia.com/gpu" $gpus) ($resources.limits | default dict)) }}
{{- end -}}
{{- $rdma := dig "network" "rdma" dict $t -}}
{{- with $rdma.resources }}
{{- $_ := set $resources "limits" (merge (deepCopy .) ($resources.limits | default dict)) }}
{{- $_ := set $resources "requests" (merge (deepCopy .) ($resources.requests | default dict)) }}
{{- end -}}
{{- $security := dict -}}
{{- if $rdma.ipcLock }}
{{- $security = dict "securityContext" (dict "capabilities" (dict "add" (list "IPC_LOCK"))) }}
{{- end -}}
processes: {{ $processes }}
resources:
  {{- toYaml $resources | nindent 2 }}
securityContext:
  {{- include "gearshift.containerSecurityContext" (dict "root" $root "values" $security) | nindent 2 }}
env:
  {{- include "gearshift.platformEnv" (dict "root" $root "database" true "dataDir" $t.checkpoints.mountPath) | nindent 2 }}
  - name: USER
    value: gearshift
  {{- include "gearshift.trainingEnv" (dict "values" $t "processes" $processes "cpu" (dig "limits" "cpu" "" $resources)) | nindent 2 }}
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
  {{- with include "gearshift.tlsVolumeMounts" $root }}
  {{- . | nindent 2 }}
  {{- end }}
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
  {{- with include "gearshift.tlsVolumes" $root }}
  {{- . | nindent 2 }}
  {{- end }}
{{- end }}

{{/* The ServiceAccount of training pods: no API token, the pods never call the API server. */}}
{{- define "gearshift.trainingServiceAccount" -}}
{{- include "gearshift.componentName" (dict "root" . "name" "training") }}
{{- end }}

{{/*
The Job spec of one training run (training.launcher job): `gearshift train <algorithm> --config
<file>` in one pod, under torchrun --standalone when training.gpus > 1.
Args: root, algorithm, configMap (holds config.yaml), ttl (bool: delete the Job after it ends).
*/}}
{{- define "gearshift.trainingJobSpec" -}}
{{- $root := .root -}}
{{- $t := $root.Values.training -}}
{{- $gpus := int $t.gpus -}}
{{- $parts := fromYaml (include "gearshift.trainingPodParts" (dict "root" $root "configMap" .configMap)) -}}
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
    serviceAccountName: {{ include "gearshift.trainingServiceAccount" $root }}
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
          {{- toYaml $parts.env | nindent 10 }}
        {{- with $t.envFromSecret }}
        envFrom:
          - secretRef:
              name: {{ . }}
        {{- end }}
        resources:
          {{- toYaml $parts.resources | nindent 10 }}
        securityContext:
          {{- toYaml $parts.securityContext | nindent 10 }}
        volumeMounts:
          {{- toYaml $parts.volumeMounts | nindent 10 }}
    volumes:
      {{- toYaml $parts.volumes | nindent 6 }}
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
The TrainJob spec of one training run (training.launcher trainjob): Kubeflow Trainer runs
training.nodes pods of the runtime's `node` job, each `torchrun -m gearshift.cli train ...` with
one process per GPU; torchrun's rendezvous (nodes, rank, master) comes from the PET_* variables
the runtime sets. The runtime's pods get what the Job's pod has through one runtime patch (a
TrainJob may patch only the pod fields a PodSpecPatch/ContainerPatch has: no envFrom, no
automountServiceAccountToken, hence the token-less ServiceAccount).
Args: root, algorithm, configMap (holds config.yaml).
*/}}
{{- define "gearshift.trainJobSpec" -}}
{{- $root := .root -}}
{{- $t := $root.Values.training -}}
{{- if $t.envFromSecret }}
{{- fail "training.envFromSecret: a TrainJob's trainer takes env entries only (no envFrom); with training.launcher=trainjob give secret settings as training.env or through the chart's Secrets" }}
{{- end }}
{{- $parts := fromYaml (include "gearshift.trainingPodParts" (dict "root" $root "configMap" .configMap)) -}}
runtimeRef:
  name: {{ $t.trainJobRuntime }}
  apiGroup: trainer.kubeflow.org
  kind: ClusterTrainingRuntime
activeDeadlineSeconds: {{ $t.activeDeadlineSeconds }}
trainer:
  image: {{ include "gearshift.image" (dict "root" $root "image" $t.image) }}
  command: ["torchrun", "-m", "gearshift.cli", "train"]
  args: [{{ .algorithm | quote }}, "--config", "/etc/gearshift/train/config.yaml"]
  numNodes: {{ int $t.nodes }}
  numProcPerNode: {{ $parts.processes }}
  resourcesPerNode:
    {{- toYaml $parts.resources | nindent 4 }}
  env:
    {{- toYaml $parts.env | nindent 4 }}
runtimePatches:
  - manager: gearshift.io/chart
    trainingRuntimeSpec:
      template:
        spec:
          replicatedJobs:
            - name: node
              template:
                spec:
                  template:
                    metadata:
                      # The platform labels: the store's NetworkPolicy admits pods that carry them.
                      labels:
                        {{- include "gearshift.labels" (dict "root" $root "name" "training") | nindent 24 }}
                    spec:
                      serviceAccountName: {{ include "gearshift.trainingServiceAccount" $root }}
                      securityContext:
                        {{- toYaml $root.Values.podSecurityContext | nindent 24 }}
                      {{- with $root.Values.imagePullSecrets }}
                      imagePullSecrets:
                        {{- toYaml . | nindent 24 }}
                      {{- end }}
                      {{- with $t.nodeSelector }}
                      nodeSelector:
                        {{- toYaml . | nindent 24 }}
                      {{- end }}
                      {{- with $t.tolerations }}
                      tolerations:
                        {{- toYaml . | nindent 24 }}
                      {{- end }}
                      {{- with $t.affinity }}
                      affinity:
                        {{- toYaml . | nindent 24 }}
                      {{- end }}
                      volumes:
                        {{- toYaml $parts.volumes | nindent 24 }}
                      containers:
                        - name: node
                          securityContext:
                            {{- toYaml $parts.securityContext | nindent 28 }}
                          volumeMounts:
                            {{- toYaml $parts.volumeMounts | nindent 28 }}
{{- end }}

{{/*
A training run's object for training.launcher: the Job or the TrainJob of one run, with its
apiVersion and kind. TrainJobs need Kubeflow Trainer's CRDs in the cluster (helm template:
--api-versions trainer.kubeflow.org/v1alpha1). Args: root, metadata (dict), algorithm,
configMap, ttl (Jobs only).
*/}}
{{- define "gearshift.trainingRun" -}}
{{- $t := .root.Values.training -}}
{{- if eq $t.launcher "trainjob" }}
{{- include "gearshift.requireTrainer" .root }}
{{- toYaml (dict
  "apiVersion" "trainer.kubeflow.org/v1alpha1"
  "kind" "TrainJob"
  "metadata" .metadata
  "spec" (fromYaml (include "gearshift.trainJobSpec" .))) }}
{{- else }}
{{- toYaml (dict
  "apiVersion" "batch/v1"
  "kind" "Job"
  "metadata" .metadata
  "spec" (fromYaml (include "gearshift.trainingJobSpec" .))) }}
{{- end }}
{{- end }}

{{/* Refuses launcher trainjob on a cluster without Kubeflow Trainer's TrainJob CRD. */}}
{{- define "gearshift.requireTrainer" -}}
{{- if not (.Capabilities.APIVersions.Has "trainer.kubeflow.org/v1alpha1") }}
{{- fail "training.launcher=trainjob needs Kubeflow Trainer (the TrainJob CRD, trainer.kubeflow.org/v1alpha1) in the cluster: install Kubeflow Trainer and its torch-distributed runtime first, or set training.launcher=job (with helm template, pass --api-versions trainer.kubeflow.org/v1alpha1)" }}
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
  "store_addr" (include "gearshift.serviceAddress" (dict "root" .root "name" "store"))
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
