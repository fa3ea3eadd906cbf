"""Several servers' /metrics merged into one (the Ray Serve ingress's): each sample keeps
its value and gains the label naming its server; each family appears once."""

from __future__ import annotations

from types import SimpleNamespace

from prometheus_client.parser import text_string_to_metric_families

from pxvm.serve.metrics import ServerMetrics, merge_labelled


def _samples(text: bytes, extra: dict | None = None) -> set:
    return {(s.name, tuple(sorted({**s.labels, **(extra or {})}.items())), s.value)
            for family in text_string_to_metric_families(text.decode())
            for s in family.samples}


def test_merged_metrics_keep_every_servers_samples_labelled_by_server():
    stats = SimpleNamespace(running=1, waiting=2, kv_blocks_used=3, kv_blocks_total=10,
                            prompt_tokens_total=50, generated_tokens_total=70)
    busy, idle = ServerMetrics(lambda: stats), ServerMetrics(lambda: None)
    busy.ttft.observe(0.03)
    idle.inter_token.observe(0.004)
    texts = {"r1": busy.render(), "r2": idle.render()}
    merged = merge_labelled(texts)
    assert _samples(merged) == (_samples(texts["r1"], {"replica": "r1"})
                                | _samples(texts["r2"], {"replica": "r2"}))
    types = [line for line in merged.decode().splitlines() if line.startswith("# TYPE")]
    assert len(types) == len(set(types))
    assert "# TYPE pxvm_generation_tokens_total counter" in types
