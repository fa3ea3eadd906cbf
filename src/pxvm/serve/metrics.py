"""/metrics in Prometheus' text format: the engine's queue and KV cache read from
Engine.stats() at each scrape, and the server's own latency histograms. Each app has its
own registry (no global state: several servers can live in one process, as in tests)."""

from __future__ import annotations

from typing import Callable

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

# seconds; TTFT spans prefill waits, inter-token a decoding step of a batch
_TTFT_BUCKETS = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 30, 60)
_ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5)


class _EngineCollector:
    """Reads the engine's counters when scraped (nothing while it is still loading)."""

    def __init__(self, stats: Callable[[], object | None]):
        self.stats = stats

    def collect(self):
        s = self.stats()
        if s is None:
            return
        for name, doc, value in (
                ("pxvm_requests_running", "Requests in the running batch", s.running),
                ("pxvm_requests_waiting", "Requests queued for the batch", s.waiting),
                ("pxvm_kv_blocks_used", "KV cache blocks in use", s.kv_blocks_used),
                ("pxvm_kv_blocks_total", "KV cache blocks in all", s.kv_blocks_total)):
            yield GaugeMetricFamily(name, doc, value=value)
        yield CounterMetricFamily("pxvm_prompt_tokens", "Prompt tokens processed",
                                  value=s.prompt_tokens_total)
        yield CounterMetricFamily("pxvm_generation_tokens", "Tokens generated",
                                  value=s.generated_tokens_total)


class ServerMetrics:
    def __init__(self, stats: Callable[[], object | None]):
        self.registry = CollectorRegistry()
        self.registry.register(_EngineCollector(stats))
        self.ttft = Histogram("pxvm_time_to_first_token_seconds",
                              "From a request's arrival to its first token",
                              buckets=_TTFT_BUCKETS, registry=self.registry)
        self.inter_token = Histogram("pxvm_inter_token_latency_seconds",
                                     "Between consecutive tokens of a sequence",
                                     buckets=_ITL_BUCKETS, registry=self.registry)

    def render(self) -> bytes:
        return generate_latest(self.registry)


def merge_labelled(texts: dict[str, bytes], label: str = "replica") -> bytes:
    """Several servers' /metrics as one exposition: every sample of the text under key K
    gets the label `label`="K" (a family's HELP and TYPE once). Prometheus sums them with
    `sum without (replica)`."""
    from prometheus_client.parser import text_string_to_metric_families
    from prometheus_client.samples import Sample

    families: dict[str, object] = {}
    for key, text in sorted(texts.items()):
        for family in text_string_to_metric_families(text.decode("utf-8")):
            merged = families.setdefault(family.name, _empty_like(family))
            merged.samples += [Sample(s.name, {**s.labels, label: key}, s.value, s.timestamp,
                                      s.exemplar) for s in family.samples]
    registry = CollectorRegistry()
    registry.register(_Fixed(list(families.values())))
    return generate_latest(registry)


def _empty_like(family):
    from prometheus_client.metrics_core import Metric
    return Metric(family.name, family.documentation, family.type, family.unit)


class _Fixed:
    def __init__(self, families):
        self.families = families

    def collect(self):
        return self.families
