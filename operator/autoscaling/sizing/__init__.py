"""Autoscaling's sizing: what one replica does and what a fleet needs. Pure.

Owns: `replica_model` (a replica's step costs and a fixed fleet under a steady load), `fleet_sizing` (the fleet a
steady rate needs within the TTFT target), `calibration` (the replica model fitted from the service's own metrics)
and `calibrated_sizing` (that fit as the predictive policy's sizing).

May import: nothing of the operator but the shared modules; the other autoscaling sub-rooms build on it.
"""
