#!/usr/bin/env bash
# Loads a local (podman/buildah) image into the containerd of ../shared/k8s-local's real node, as
# `kind load docker-image` does for kind: make e2e E2E_LOAD_IMAGE='.ci/k8s-local-load-image.sh {image}'.
set -euo pipefail
image=$1
K8S_LOCAL=${K8S_LOCAL:-$(cd "$(dirname "$0")/../.." && pwd)/k8s-local}
archive=$(mktemp --suffix=.tar); trap 'rm -f "$archive"' EXIT
rm -f "$archive"
podman save --quiet --format oci-archive -o "$archive" "$image"
ctr --address "$K8S_LOCAL/node/containerd/containerd.sock" -n k8s.io images import "$archive" >/dev/null
echo "loaded $image into $K8S_LOCAL's node"
