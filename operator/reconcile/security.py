"""The security contexts of every pod the operator makes (replicas, their model download, routers): a fixed
non-root uid, no privilege escalation, no capabilities, a read-only root filesystem (so every writable path is
an explicit volume), and the runtime's default seccomp profile."""

from __future__ import annotations

from typing import Any

RUN_AS_USER = 1000


def container_security_context() -> dict[str, Any]:
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
    }


def pod_security_context() -> dict[str, Any]:
    return {
        "runAsNonRoot": True,
        "runAsUser": RUN_AS_USER,
        "runAsGroup": RUN_AS_USER,
        "fsGroup": RUN_AS_USER,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
