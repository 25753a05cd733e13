"""Distributed frontier on Redis: partitions, leases, at-least-once delivery."""
