"""Network-aware placement cores: GNP coordinates, link statistics, assignment.

Pure like :mod:`scrapy_banker.core` (which they may use): GNP embedding and
landmark selection, the statistically weighted latency and bandwidth
windows, the patent's cost and Hungarian assignment, the partition table,
the placement strategies, and the fleet-size model.
"""
