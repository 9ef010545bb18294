#!/usr/bin/env bash
# Extra `podman run` flags this host needs (printed on one line; empty on an ordinary host):
# - runc where it is installed: crun refuses hosts with hybrid cgroups (v1 + v2);
# - ulimits at or under the hard limits: podman's defaults ask for more than a container host may grant
#   (nproc above 32768 was refused here even under the hard limit).
flags=()
command -v runc >/dev/null && flags+=(--runtime runc)
n=$(ulimit -Hn); u=$(ulimit -Hu)
[ "$n" != unlimited ] && flags+=(--ulimit "nofile=$n:$n")
[ "$u" = unlimited ] || [ "$u" -gt 32768 ] && u=32768
flags+=(--ulimit "nproc=$u:$u")
echo "${flags[@]}"
