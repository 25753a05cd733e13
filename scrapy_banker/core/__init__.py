"""Pure cores: one idea per module, no Scrapy, Twisted, Redis or I/O.

The algorithms scrapy-banker is made of -- BKDR hashing and the extendible
hash directory, topic scheduling, the slot-lane frontier, the Banker's
algorithm, the JOBDIR journal's records, the spill format, telemetry
samples, the pacer -- importable and testable without a crawler.
``tests/test_layers.py`` checks that nothing in this folder imports Scrapy,
Twisted or Redis, directly or through another module.
"""
