"""The check that an engine has given back every KV block, row and request once its work is done."""


def assert_no_leak(llm) -> None:
    manager = llm.engine.block_manager
    assert manager.num_free_blocks == manager.num_blocks
    assert not any(manager.ref_counts)
    assert not manager.rows
    assert llm.engine.scheduler.num_unfinished == 0 and not llm.engine.requests
