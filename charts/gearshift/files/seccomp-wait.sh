# The sandbox pod's first init container: the kubelet cannot start a container whose Localhost
# seccomp profile is not on the node yet, so wait until the installer DaemonSet has written the
# chart's profile (SECCOMP_PROFILE, from its ConfigMap) as SECCOMP_INSTALLED (the node's copy,
# through a read-only hostPath), byte for byte: after an upgrade that changed the profile a new
# pod waits for the new one.
set -eu
if ! cmp -s "$SECCOMP_PROFILE" "$SECCOMP_INSTALLED"; then
  echo "waiting for the seccomp installer to write ${SECCOMP_NODE_PATH:-$SECCOMP_INSTALLED} on this node"
  until cmp -s "$SECCOMP_PROFILE" "$SECCOMP_INSTALLED"; do sleep 2; done
fi
echo "seccomp profile present: ${SECCOMP_NODE_PATH:-$SECCOMP_INSTALLED}"
