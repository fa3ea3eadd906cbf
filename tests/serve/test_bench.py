"""`pxvm bench serve`'s measuring: every request of a level is counted with its tokens and
timings, servers off this machine are refused, and the plot is a PNG."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image
from serving import server, tiny_model  # noqa: F401 - fixtures

from pxvm.llm.tokenizer import Tokenizer
from pxvm.serve import bench


def test_a_level_counts_every_request_and_its_tokens_after_a_warmup(server):  # noqa: F811
    tokenizer = Tokenizer(server.service.engine.model.metadata)
    settings = bench.Settings([3], requests=6, input_len=10, output_len=5)
    before = server.service.engine.stats().generated_tokens_total
    (level,) = bench.run(settings, tokenizer, server.url + "/v1", "tiny")
    assert (level.concurrency, level.requests, level.failed) == (3, 6, 0)
    assert level.output_tokens == 6 * 5
    # the server also generated the unmeasured warm-up: N = 3 requests
    warmup = 3 * min(bench.WARMUP_TOKENS, 5)
    assert server.service.engine.stats().generated_tokens_total - before == 6 * 5 + warmup
    assert level.output_tokens_per_s == pytest.approx(30 / level.duration_s)
    assert 0 < level.ttft_ms["p50"] <= level.ttft_ms["p99"]
    assert level.tpot_ms["p50"] is not None


def test_a_level_spread_over_client_processes_counts_every_request(server):  # noqa: F811
    tokenizer = Tokenizer(server.service.engine.model.metadata)
    settings = bench.Settings([3], requests=7, input_len=10, output_len=4)
    before = server.service.engine.stats().generated_tokens_total
    (level,) = bench.run(settings, tokenizer, server.url + "/v1", "tiny", processes=2)
    assert (level.concurrency, level.requests, level.failed) == (3, 7, 0)
    assert level.output_tokens == 7 * 4
    warmup = 3 * min(bench.WARMUP_TOKENS, 4)
    assert server.service.engine.stats().generated_tokens_total - before == 7 * 4 + warmup
    assert 0 < level.ttft_ms["p50"] <= level.ttft_ms["p99"]
    assert level.output_tokens_per_s == pytest.approx(28 / level.duration_s)


def test_random_prompts_have_the_length_asked_and_no_control_tokens(server):  # noqa: F811
    tokenizer = Tokenizer(server.service.engine.model.metadata)
    prompts = bench.random_prompts(tokenizer, 4, 33, np.random.default_rng(0))
    assert [len(p) for p in prompts] == [33] * 4
    assert not set(sum(prompts, [])) & tokenizer.control_ids


@pytest.mark.parametrize("url", ["http://example.com:8080", "https://127.0.0.1:8080",
                                 "http://10.0.0.1:8000/v1"])
def test_servers_off_this_machine_are_refused(url):
    with pytest.raises(bench.BenchError):
        bench.check_loopback(url)


def test_loopback_urls_get_their_v1_root():
    assert bench.check_loopback("http://127.0.0.1:8080") == "http://127.0.0.1:8080/v1"
    assert bench.check_loopback("http://localhost:8080/v1/") == "http://localhost:8080/v1"


def test_the_plot_is_a_png_of_the_levels(tmp_path):
    levels = [bench.Level(n, 4, 0, 1.0, 40 * n, 40.0 * n, 4.0,
                          {"p50": 10.0 * n, "p99": 20.0 * n, "mean": 12.0},
                          {"p50": 1.0, "p99": 2.0, "mean": 1.5}, {"p50": 1.0, "p99": 2.0})
              for n in (1, 4, 16)]
    path = tmp_path / "serve.png"
    bench.write_plot(levels, path, "test")
    assert Image.open(path).format == "PNG"
