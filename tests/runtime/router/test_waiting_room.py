"""The router's waiting room lets requests go in a tenant-fair order once a replica is up: strict priority classes,
then the fewest requests let go per unit of weight, arrival order within a tenant. Real asyncio (tasks, the room's
own deadlines); the replica is a semaphore (its limited concurrency) that records whom it serves, in order."""
import asyncio
import time

import pytest

from kubeinfer.runtime.router.replicas import ReplicaSet
from kubeinfer.runtime.router.waiting_room import Refused, WaitingRoom
from kubeinfer.runtime.server.auth import ANONYMOUS, Tenant

DEADLINE_S = 60.0   # each request's wait in the room: a test that hangs fails with 503 at the latest then


async def serve_after_waiting(senders: list[tuple[Tenant, int]], slots: int = 2) -> list[str]:
    """Queues each sender's requests in the room while no replica is up (all of the first sender's, then the
    next's ...), brings a replica with `slots` requests at a time up, and returns the tenants in the order it
    served them."""
    replicas = ReplicaSet([])
    room = WaitingRoom(replicas, max_requests=1000, max_bytes=1 << 20, timeout_s=DEADLINE_S)
    replica, served = asyncio.Semaphore(slots), []

    async def request(tenant: Tenant) -> None:
        await room.wait_until_up(100, time.monotonic() + DEADLINE_S, tenant)
        async with replica:
            served.append(tenant.name)
            await asyncio.sleep(0.001)

    tasks = []
    for tenant, count in senders:
        tasks += [asyncio.ensure_future(request(tenant)) for _ in range(count)]
        while room.num_waiting < len(tasks):   # queued in this order
            await asyncio.sleep(0)
    assert not served and room.num_bytes == 100 * len(tasks)
    replicas.any_up.set()
    await asyncio.gather(*tasks)
    assert room.num_waiting == 0 and room.num_bytes == 0 and not room.turns
    await room.releasing
    return served


async def test_a_small_tenant_behind_a_flood_is_served_among_the_first_once_a_replica_is_up():
    a, b = Tenant("a"), Tenant("b")
    served = await serve_after_waiting([(a, 20), (b, 2)])
    assert sorted(served) == ["a"] * 20 + ["b"] * 2
    assert [i for i, name in enumerate(served) if name == "b"] == [1, 3]   # arrival order would say 20, 21


async def test_weights_share_the_releases_and_anonymous_is_one_tenant():
    heavy, light = Tenant("heavy", weight=3), Tenant("light")
    served = await serve_after_waiting([(light, 10), (heavy, 10), (ANONYMOUS, 10)], slots=1)
    first = served[:15]   # while all three still wait: 3 of heavy's for each of the others'
    assert (first.count("heavy"), first.count("light"), first.count("anonymous")) == (9, 3, 3)


async def test_a_higher_class_goes_first_whatever_it_was_let_go_before():
    batch, urgent = Tenant("batch", priority=1), Tenant("urgent", weight=0.1, priority=0)
    served = await serve_after_waiting([(batch, 10), (urgent, 5)], slots=1)
    assert served[:5] == ["urgent"] * 5


async def test_a_tenant_back_after_a_pause_banks_no_credit():
    """A let 6 go alone; then B, new, and A again wait: B starts at A's count, so they alternate, B does not
    get 6 in a row."""
    replicas = ReplicaSet([])
    room = WaitingRoom(replicas, 1000, 1 << 20, DEADLINE_S)
    a, b = Tenant("a"), Tenant("b")
    for _ in range(6):
        room.turns.add(a, asyncio.get_running_loop().create_future())
    for _ in range(6):
        room.turns.pop()
    order = []
    for tenant in (a, a, a, b, b, b):
        turn = asyncio.get_running_loop().create_future()
        room.turns.add(tenant, turn)
        turn.add_done_callback(lambda _, name=tenant.name: order.append(name))
    while room.turns:
        room.turns.pop().set_result(None)
    await asyncio.sleep(0)
    assert order == ["a", "b", "a", "b", "a", "b"]


async def test_a_request_that_leaves_or_times_out_gives_up_its_place_and_its_bytes():
    replicas = ReplicaSet([])
    room = WaitingRoom(replicas, max_requests=2, max_bytes=1 << 20, timeout_s=0.2)
    a = Tenant("a")
    leaving = asyncio.ensure_future(room.wait_until_up(10, time.monotonic() + DEADLINE_S, a))
    timing_out = asyncio.ensure_future(room.wait_until_up(20, time.monotonic() + 0.2, a))
    while room.num_waiting < 2:
        await asyncio.sleep(0)
    with pytest.raises(Refused) as full:   # the count's bound
        await room.wait_until_up(1, time.monotonic() + DEADLINE_S, a)
    assert full.value.status == 429 and full.value.code == "queue_full"
    leaving.cancel()   # its client went away
    with pytest.raises(Refused) as late:
        await timing_out
    assert late.value.status == 503 and late.value.code == "no_replica"
    assert (room.num_waiting, room.num_bytes, len(room.turns)) == (0, 0, 0)
    replicas.any_up.set()
    assert await room.wait_until_up(5, time.monotonic() + DEADLINE_S, a) == 0.0   # nothing waits: at once
    room.releasing.cancel()
