# The sandbox's seccomp profile onto this node (templates/sandbox/seccomp.yaml's DaemonSet): copies
# SECCOMP_PROFILE (the chart's profile, from its ConfigMap) to SECCOMP_TARGET (in the kubelet's
# seccomp directory, a hostPath), then checks it every minute and copies it again when it changed
# or went missing (a ConfigMap update, a cleaned node). The copy is renamed into place, so a
# container starting meanwhile reads a whole profile, old or new. A DaemonSet's pod must keep
# running: it sleeps between checks and exits at once on SIGTERM.
set -eu
sleeper=
install_profile() {
  mkdir -p "$(dirname "$SECCOMP_TARGET")"
  cp "$SECCOMP_PROFILE" "$SECCOMP_TARGET.tmp"
  mv -f "$SECCOMP_TARGET.tmp" "$SECCOMP_TARGET"
  echo "seccomp profile installed at ${SECCOMP_NODE_PATH:-$SECCOMP_TARGET}"
}
trap 'kill "$sleeper" 2>/dev/null || true; exit 0' TERM INT  # set -e would exit 1 on a sleeper already gone
while :; do
  cmp -s "$SECCOMP_PROFILE" "$SECCOMP_TARGET" || install_profile
  sleep "${SECCOMP_CHECK_SECONDS:-60}" &
  sleeper=$!
  wait "$sleeper" || true
done
