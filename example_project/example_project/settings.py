"""Settings of the example project: an ordinary Scrapy project plus scrapy-banker.

Everything scrapy-banker does here is switched on by the ``ADDONS`` line and
tuned by ``BANKER_*`` settings; the spider itself knows nothing about it.
"""

from scrapy_banker.testing.resolver import farm_settings

BOT_NAME = "example_project"
SPIDER_MODULES = ["example_project.spiders"]
NEWSPIDER_MODULE = "example_project.spiders"

ROBOTSTXT_OBEY = False
CONCURRENT_REQUESTS = 32
CONCURRENT_REQUESTS_PER_DOMAIN = 4
DOWNLOAD_DELAY = 0
RETRY_TIMES = 2
LOG_LEVEL = "INFO"
TELNETCONSOLE_ENABLED = False

# One line enables scrapy-banker (scheduler, middlewares, stats export).
ADDONS = {"scrapy_banker.Addon": 500}

# The explicit form, equivalent to the add-on:
# SCHEDULER = "scrapy_banker.scheduler.BankerScheduler"
# SPIDER_MIDDLEWARES = {"scrapy_banker.middlewares.BankerTopicMiddleware": 950}
# DOWNLOADER_MIDDLEWARES = {"scrapy_banker.middlewares.BankerDownloaderMiddleware": 860}
# EXTENSIONS = {
#     "scrapy_banker.extensions.BankerStatsFile": 500,
#     "scrapy_banker.extensions.BankerTopicAdjuster": 500,
# }

# Topics: news preempts; products and archive share by round-robin time slices
# (products gets twice archive's slice); archive's slice shrinks when it meets
# its yield target, leaving more turns to products.
BANKER_TOPICS = {
    "news": {"priority": 10},
    "products": {"priority": 0, "slice": 1.0},
    "archive": {"priority": 0, "slice": 0.5, "target": 200},
}
BANKER_TOPIC_ADJUST_INTERVAL = 2.0
BANKER_TOPIC_MAX_WAIT = 5.0
BANKER_TOPIC_RULES = [
    {"url": r"^https?://[^/]+/news/", "topic": "news"},
    {"url": r"^https?://[^/]+/products/", "topic": "products"},
    {"url": r"^https?://[^/]+/archive/", "topic": "archive"},
]
BANKER_DEFAULT_TOPIC = "index"

# The local web farm's virtual hosts (h0000.farm.test, ...) resolve to 127.0.0.1.
# Remove this line to crawl real sites.
locals().update(farm_settings())
