"""Entry point: ``kubeinfer operator [...]`` or ``python -m kubeinfer.operator [...]``."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading

import kopf
from kubernetes.client import ApiException

from kubeinfer.operator import handlers  # noqa: F401  (registers the handlers)
from kubeinfer.operator import peering, preflight
from kubeinfer.operator.config import OperatorConfig
from kubeinfer.operator.kube import Kube

log = logging.getLogger(__name__)
STOP_BUDGET_SECONDS = 1.0   # from SIGTERM to the process's end, whatever kopf has left


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
    run_until_stopped(dict(
        standalone=mode.standalone,
        peering_name=mode.name,
        priority=config.priority,
        namespaces=list(config.namespaces),
        clusterwide=not config.namespaces,
        liveness_endpoint=config.liveness_endpoint,
        memo=kopf.Memo(config=config),
    ))


def run_until_stopped(kopf_settings: dict[str, object]) -> None:
    """Runs kopf on a thread of its own until it stops by itself, or until STOP_BUDGET_SECONDS after SIGTERM/SIGINT.

    On SIGTERM (a rollout, or a `helm uninstall` that also deletes our RBAC, so that every request is now refused)
    kopf is told to stop and gets STOP_BUDGET_SECONDS; then the process ends whatever is left. What can be left:
    handler threads in a call, and kopf removing itself from the peering object, which it retries for ~12 s on a
    403 (measured on the real node: the pod took 13 s to go). All of it is idempotent and the next copy redoes it;
    a peering record left behind expires by itself. kopf runs off the main thread so that the signal is this
    function's (kopf would take it on the main thread), and the process ends with os._exit only after a signal."""
    stopping = threading.Event()
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}

    def on_signal(signum: int, _frame: object) -> None:
        if not stopping.is_set():
            log.info("%s: stopping, at most %.1f s", signal.Signals(signum).name, STOP_BUDGET_SECONDS)
            stopping.set()
            threading.Timer(STOP_BUDGET_SECONDS, _exit_now).start()

    for sig in previous:
        signal.signal(sig, on_signal)
    logging.getLogger("kopf._core.reactor.running").addFilter(   # its signals are ours, on purpose
        lambda record: "OS signals are ignored" not in record.getMessage())
    runner = threading.Thread(target=kopf.run, kwargs={**kopf_settings, "stop_flag": stopping}, name="kopf",
                              daemon=True)
    try:
        runner.start()
        while runner.is_alive():
            runner.join(0.2)   # wakes the main thread, which runs the signal handler
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if stopping.is_set():
        _exit_now()


def _exit_now() -> None:
    logging.shutdown()
    os._exit(0)


if __name__ == "__main__":
    main()
