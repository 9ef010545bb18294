"""Gives an engine core its KV role from the config: the TCP transport and the engine-side half of the role."""
from kubeinfer.runtime.disagg.connector import TransferTimeouts
from kubeinfer.runtime.disagg.exporter import KVExporter
from kubeinfer.runtime.disagg.importer import KVImporter
from kubeinfer.runtime.disagg.layout import KVLayout
from kubeinfer.runtime.disagg.tcp_puller import TcpKVPuller
from kubeinfer.runtime.disagg.tcp_source import TcpKVSource


def start_kv_role(core, config) -> None:
    kv_cache = core.model_runner.kv_cache
    layout = KVLayout.of_cache(config.served_model_name, kv_cache)
    timeouts = TransferTimeouts(idle_s=config.kv_idle_timeout_s)
    if config.kv_role == "prefill":
        source = TcpKVSource(layout, kv_cache, config.kv_host, config.kv_port, timeouts)
        core.kv_exporter = KVExporter(core, source, core.transfer_progress)
    else:
        core.kv_importer = KVImporter(core, TcpKVPuller(layout, kv_cache, timeouts), core.transfer_progress)
