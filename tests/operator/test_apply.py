"""The no-op / drift decision of the apply step (pure part)."""

from __future__ import annotations

from kubeinfer.operator.reconcile.apply import in_sync, is_subset
from kubeinfer.operator.reconcile.builders import HASH_ANNOTATION


def test_subset_allows_server_defaults_and_foreign_fields() -> None:
    want = {"spec": {"containers": [{"name": "a", "image": "x"}]}}
    have = {"spec": {"containers": [{"name": "a", "image": "x", "terminationMessagePath": "/dev/termination-log"}],
                     "dnsPolicy": "ClusterFirst"}}
    assert is_subset(want, have)


def test_subset_catches_changed_and_removed_values() -> None:
    want = {"spec": {"containers": [{"name": "a", "image": "x"}], "replicas": 2}}
    assert not is_subset(want, {"spec": {"containers": [{"name": "a", "image": "y"}], "replicas": 2}})
    assert not is_subset(want, {"spec": {"containers": [{"name": "a"}], "replicas": 2}})
    assert not is_subset(want, {"spec": {"containers": [{"name": "a", "image": "x"}, {"name": "b"}], "replicas": 2}})


def test_subset_compares_quantities_by_value() -> None:
    assert is_subset({"cpu": "1000m", "memory": "1Gi"}, {"cpu": "1", "memory": "1024Mi"})
    assert not is_subset({"cpu": "2"}, {"cpu": "1"})
    assert not is_subset({"image": "a"}, {"image": "b"})


def test_in_sync_needs_the_same_hash_and_the_same_fields() -> None:
    desired = {"metadata": {"annotations": {HASH_ANNOTATION: "h1"}}, "spec": {"replicas": 2}}
    assert in_sync(desired, {"metadata": {"annotations": {HASH_ANNOTATION: "h1", "x": "y"}}, "spec": {"replicas": 2}})
    assert not in_sync(desired, None)
    assert not in_sync(desired, {"metadata": {"annotations": {HASH_ANNOTATION: "h0"}}, "spec": {"replicas": 2}})
    assert not in_sync(desired, {"metadata": {"annotations": {HASH_ANNOTATION: "h1"}}, "spec": {"replicas": 5}})
