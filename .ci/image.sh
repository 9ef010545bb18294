#!/usr/bin/env bash
# `make image`: builds one target of the root Containerfile with buildah, as `docker build --target` would, on a
# machine that cannot pull from registries: the base is Debian 12 made locally with mmdebstrap (the same
# bookworm that debian:bookworm-slim is). Prints the build time and the image size.
#
# Env: IMAGE_TARGET (runtime|operator), IMAGE (tag), IMAGE_VARIANT (cpu|gpu; runtime only), BASE_IMAGE,
#      DEBIAN_MIRROR, WHEELS_DIR (a folder holding a
#      torch +cpu wheel: used instead of PyTorch's index), PIP_CA (CA bundle pip needs behind a TLS proxy),
#      BUILD_MOUNT (scratch folder mounted read-only at /mnt during RUN steps; /mnt exists in Debian, so
#      nothing of it is left in the image).
set -euo pipefail
cd "$(dirname "$0")/.."
IMAGE_TARGET=${IMAGE_TARGET:-runtime}
IMAGE_VARIANT=${IMAGE_VARIANT:-cpu}
version=$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
case $IMAGE_TARGET in
  runtime) suffix=$([ "$IMAGE_VARIANT" = gpu ] || echo "-$IMAGE_VARIANT")
           IMAGE=${IMAGE:-ghcr.io/kubeinfer/runtime:$version$suffix} ;;
  operator) IMAGE=${IMAGE:-ghcr.io/kubeinfer/operator:$version} ;;
  *) echo "image.sh: IMAGE_TARGET must be runtime or operator, not '$IMAGE_TARGET'" >&2; exit 1 ;;
esac
BASE_IMAGE=${BASE_IMAGE:-localhost/kubeinfer/debian:bookworm}
DEBIAN_MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
WHEELS_DIR=${WHEELS_DIR:-/opt/wheels}
PIP_CA=${PIP_CA:-${PIP_CERT:-}}
BUILD_MOUNT=${BUILD_MOUNT:-$PWD/.image-build}

# need TOOL PACKAGE...: installs the packages when TOOL is missing and this runs as root with apt-get (as
# `make test` installs Prometheus), else stops saying what to install.
need() {
  local tool=$1; shift
  command -v "$tool" >/dev/null && return
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "image.sh: $tool not found: apt-get install $*"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null; } \
      || { echo "image.sh: installing $* failed" >&2; exit 1; }
  else
    echo "image.sh: $tool not found (apt-get install $*)" >&2; exit 1
  fi
}

need buildah buildah podman fuse-overlayfs
need podman buildah podman fuse-overlayfs

if ! podman image exists "$BASE_IMAGE"; then
  need mmdebstrap mmdebstrap
  echo "image.sh: making the base $BASE_IMAGE (mmdebstrap --variant=minbase bookworm)"
  tar=$(mktemp --suffix=.tar); trap 'rm -f "$tar"' EXIT
  start=$SECONDS
  mmdebstrap --quiet --variant=minbase bookworm "$tar" "$DEBIAN_MIRROR"
  podman import --quiet "$tar" "$BASE_IMAGE" >/dev/null
  echo "image.sh: base made in $((SECONDS - start)) s"
fi

rm -rf "$BUILD_MOUNT"; mkdir -p "$BUILD_MOUNT/wheels"
args=(--target "$IMAGE_TARGET" --build-arg "BASE=$BASE_IMAGE" --build-arg "VARIANT=$IMAGE_VARIANT"
      --build-arg "REVISION=$(git rev-parse HEAD 2>/dev/null || echo unknown)")
if [ -n "$PIP_CA" ] && [ -f "$PIP_CA" ]; then
  cp "$PIP_CA" "$BUILD_MOUNT/ca.crt"
  args+=(--build-arg PIP_CERT=/mnt/ca.crt)
fi
wheel=$(ls "$WHEELS_DIR"/torch-*+cpu-cp311-*.whl 2>/dev/null | head -1 || true)
if [ "$IMAGE_TARGET" = runtime ] && [ "$IMAGE_VARIANT" = cpu ] && [ -n "$wheel" ]; then
  ln "$wheel" "$BUILD_MOUNT/wheels/" 2>/dev/null || cp "$wheel" "$BUILD_MOUNT/wheels/"
  args+=(--build-arg PIP_FIND_LINKS=/mnt/wheels --build-arg TORCH_CPU_INDEX=)
fi

start=$(date +%s.%N)
buildah bud --quiet --layers --isolation chroot -v "$BUILD_MOUNT:/mnt:ro" "${args[@]}" \
  -f Containerfile -t "$IMAGE" . >/dev/null
took=$(python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$start" "$(date +%s.%N)")
rm -rf "$BUILD_MOUNT"
size=$(podman image inspect "$IMAGE" --format '{{.Size}}')
what=$IMAGE_TARGET; [ "$IMAGE_TARGET" = runtime ] && what="runtime, $IMAGE_VARIANT"
echo "image.sh: built $IMAGE ($what) in $took s, $((size / 1000000)) MB"
