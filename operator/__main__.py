"""Entry point: ``kubeinfer operator [...]`` or ``python -m kubeinfer.operator [...]``."""

from __future__ import annotations

import argparse
import logging

import kopf

from kubeinfer.operator import handlers  # noqa: F401  (registers the handlers)
from kubeinfer.operator.config import OperatorConfig

log = logging.getLogger(__name__)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="kubeinfer operator",
        description="Run the InferenceService operator. Every flag also reads KUBEINFER_<NAME> (see docs/operator.md).")
    parser.add_argument("-n", "--namespace", action="append", dest="namespaces", metavar="NS",
                        help="watch this namespace (repeatable; globs allowed); default: all namespaces")
    parser.add_argument("--standalone", action="store_true", default=None,
                        help="do not coordinate with other copies (no peering)")
    parser.add_argument("--peering", metavar="NAME", help="peering object shared by the copies (default kubeinfer)")
    parser.add_argument("--priority", type=int, help="peering priority; the highest-priority copy acts, others wait")
    parser.add_argument("--liveness", metavar="URL", dest="liveness_endpoint",
                        help="serve a liveness probe, e.g. http://0.0.0.0:8080/healthz")
    parser.add_argument("--runtime-image", help="default runtime image of InferenceServices without one")
    parser.add_argument("--service-monitor", choices=["auto", "always", "never"],
                        help="create ServiceMonitors (auto: when the CRD exists)")
    parser.add_argument("--verbose", action="store_true", help="debug logging")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    config = OperatorConfig.from_env(
        namespaces=tuple(args.namespaces) if args.namespaces else None,
        standalone=args.standalone, peering=args.peering, priority=args.priority,
        liveness_endpoint=args.liveness_endpoint, runtime_image=args.runtime_image,
        service_monitor=args.service_monitor)
    kopf.configure(verbose=args.verbose, log_format=kopf.LogFormat.PLAIN)
    logging.getLogger("kubeinfer").setLevel(logging.DEBUG if args.verbose else logging.INFO)
    log.info("starting: namespaces=%s peering=%s", list(config.namespaces) or "all",
             "standalone" if config.standalone else config.peering)
    kopf.run(
        standalone=config.standalone,
        peering_name=None if config.standalone else config.peering,
        priority=config.priority,
        namespaces=list(config.namespaces),
        clusterwide=not config.namespaces,
        liveness_endpoint=config.liveness_endpoint,
        memo=kopf.Memo(config=config),
    )


if __name__ == "__main__":
    main()
