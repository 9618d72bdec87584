#!/usr/bin/env bash
# Makes sure a container engine answers: installs Debian's docker.io when no dockerd exists and
# starts the daemon in the background when it is not running (CI machines have no init system).
set -euo pipefail
docker_ok() { docker info >/dev/null 2>&1; }
docker_ok && exit 0
if ! command -v dockerd >/dev/null; then
  echo "installing docker.io (apt)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q docker.io >/tmp/gearshift-docker-install.log 2>&1 \
    || { apt-get update -q >/dev/null && apt-get install -y -q docker.io >/tmp/gearshift-docker-install.log 2>&1; } \
    || { tail -20 /tmp/gearshift-docker-install.log >&2; echo "could not install docker.io" >&2; exit 1; }
fi
command -v docker >/dev/null || { echo "dockerd is installed but no docker CLI is on the PATH" >&2; exit 1; }
echo "starting dockerd (log: /var/log/gearshift-dockerd.log)"
nohup dockerd >/var/log/gearshift-dockerd.log 2>&1 &
for _ in $(seq 60); do
  docker_ok && exit 0
  sleep 1
done
tail -20 /var/log/gearshift-dockerd.log >&2
echo "dockerd did not answer within 60 s" >&2
exit 1
