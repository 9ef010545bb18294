"""Entry point: ``kubeinfer operator [...]`` or ``python -m kubeinfer.operator [...]``."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading

import kopf
from kubernetes.client import ApiException

from kubeinfer.operator import handlers  # registers the handlers
from kubeinfer.operator import peering, preflight
from kubeinfer.operator.config import OperatorConfig
from kubeinfer.operator.kube import Kube

log = logging.getLogger(__name__)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="kubeinfer operator",
        description="Run the InferenceService operator. Every flag also reads KUBEINFER_<NAME> (see docs/operator.md).")
    parser.add_argument("-n", "--namespace", action="append", dest="namespaces", metavar="NS",
                        help="watch this namespace (repeatable; globs allowed); default: all namespaces")
    parser.add_argument("--standalone", action="store_true", default=None,
                        help="do not coordinate with other copies (no peering)")
    parser.add_argument("--peering", metavar="NAME", help="require peering through this object (default: peering only if the "
                        "object 'kubeinfer' exists, else standalone)")
    parser.add_argument("--priority", type=int, help="peering priority; the highest-priority copy acts, others wait")
    parser.add_argument("--liveness", metavar="URL", dest="liveness_endpoint",
                        help="serve a liveness probe, e.g. http://0.0.0.0:8080/healthz")
    parser.add_argument("--runtime-image", help="default runtime image of InferenceServices without one")
    parser.add_argument("--service-monitor", choices=["auto", "always", "never"],
                        help="create ServiceMonitors (auto: when the CRD exists)")
    parser.add_argument("--verbose", action="store_true", help="debug logging")
    return parser.parse_args(argv)


def startup_checks(config: OperatorConfig) -> peering.PeeringMode:
    """Cluster reachable, CRD served, peering mode chosen: one log line each (kubeinfer.operator.preflight)."""
    kube_config = preflight.load_configuration()
    kube = Kube(kube_config)
    preflight.wait_for_api(kube, kube_config.host)
    if config.standalone:
        return peering.choose(config, lambda path: False)

    def exists(path: str) -> bool:
        try:
            return kube.get(path) is not None
        except ApiException:
            return False  # e.g. not allowed to read it: cannot tell, so not found
    return peering.choose(config, exists)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    config = OperatorConfig.from_env(
        namespaces=tuple(args.namespaces) if args.namespaces else None,
        standalone=args.standalone, peering=args.peering, priority=args.priority,
        liveness_endpoint=args.liveness_endpoint, runtime_image=args.runtime_image,
        service_monitor=args.service_monitor)
    kopf.configure(verbose=args.verbose, log_format=kopf.LogFormat.PLAIN)
    logging.getLogger("kubeinfer").setLevel(logging.DEBUG if args.verbose else logging.INFO)
    # urllib3 logs every connection retry as a warning; the preflight says it once, in words.
    logging.getLogger("urllib3.connectionpool").setLevel(logging.DEBUG if args.verbose else logging.ERROR)
    try:
        mode = startup_checks(config)
    except preflight.ClusterUnusable as error:
        print(f"kubeinfer operator: error: {error}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(130)
    log.log(mode.level, "%s", mode.message)
    log.info("starting: namespaces=%s", list(config.namespaces) or "all")
    kopf.run(
        standalone=mode.standalone,
        peering_name=mode.name,
        priority=config.priority,
        namespaces=list(config.namespaces),
        clusterwide=not config.namespaces,
        liveness_endpoint=config.liveness_endpoint,
        memo=kopf.Memo(config=config, exit_process=True),
    )
    _exit_now()


@kopf.on.cleanup()
def _exit_soon(memo: kopf.Memo, **_: object) -> None:
    """kopf is stopping (SIGTERM: a rollout, or an uninstall that also deletes our RBAC, so every request is now
    refused). Handler threads still in a call (an unreachable pod, a refused request being retried) would hold the
    process until they end; their work is idempotent and the next copy redoes it. So the process ends
    EXIT_GRACE_SECONDS from now whatever is left (only this command's process: operators run in tests have no
    `exit_process` in their memo)."""
    if memo.get("exit_process"):
        threading.Timer(handlers.EXIT_GRACE_SECONDS, _exit_now).start()


def _exit_now() -> None:
    logging.shutdown()
    os._exit(0)


if __name__ == "__main__":
    main()
