"""`pxvm serve --replicas`: pxvm's server as two Ray Serve replicas on a local Ray cluster
(loopback, two CPUs, the tiny model on numpy) behind one endpoint, driven by the official
`openai` client: the same greedy text as one process gives, streamed and whole; /health
and /metrics through the endpoint count every replica; a replica killed mid-load fails
only the requests it held, and Ray replaces it."""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

ray = pytest.importorskip("ray")
serve = pytest.importorskip("ray.serve")

import yaml  # noqa: E402 - one of Ray's own dependencies

from openai import OpenAI  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402
from serving import live_server, long_model  # noqa: E402,F401 - fixtures

from pxvm.serve import cluster  # noqa: E402

MESSAGES = [{"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Say hello to the world."}]
GREEDY = dict(model="tiny", messages=MESSAGES, temperature=0, extra_body={"ignore_eos": True})
#: small batches: the KV cache of the 8,192-long context stays small in each replica
OPTIONS = dict(backend="numpy", max_batch=8, max_waiting=16)
ROOT = Path(__file__).resolve().parents[2]
#: seconds any one request may take before the test calls it hung
TIMEOUT = 30


@pytest.fixture(scope="module")
def endpoint(long_model):  # noqa: F811
    ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1",
             logging_level="warning", log_to_driver=False)
    try:
        yield cluster.start(str(long_model), 2, "127.0.0.1", 0, **OPTIONS)
    finally:
        cluster.stop()


def _client(url: str) -> OpenAI:
    return OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=TIMEOUT)


#: sampled text, which the seed makes reproducible, of more than the one character the
#: tiny model's greedy text repeats
SEEDED = dict(model="tiny", messages=MESSAGES, temperature=1.5, seed=7,
              extra_body={"ignore_eos": True})


def test_streamed_and_whole_chat_through_the_ingress_give_one_process_text(
        endpoint, long_model):  # noqa: F811
    # with each token's logprob: the numbers tell apart tokens whose text reads alike
    asked = {"greedy": dict(max_tokens=16, **GREEDY), "seeded": dict(max_tokens=24, **SEEDED)}
    with live_server(long_model, max_batch=8, max_waiting=16) as single:
        expected = {name: _client(single.url).chat.completions.create(
            logprobs=True, **kwargs).choices[0] for name, kwargs in asked.items()}
    assert len(set(expected["seeded"].message.content)) >= 2
    client = _client(endpoint)
    for name, kwargs in asked.items():
        whole = client.chat.completions.create(logprobs=True, **kwargs)
        assert whole.choices[0].message.content == expected[name].message.content, name
        assert [t.logprob for t in whole.choices[0].logprobs.content] == pytest.approx(
            [t.logprob for t in expected[name].logprobs.content], abs=1e-5), name
        assert whole.usage.completion_tokens == kwargs["max_tokens"]
        chunks = list(client.chat.completions.create(stream=True, **kwargs))
        streamed = "".join(c.choices[0].delta.content or "" for c in chunks)
        assert streamed == expected[name].message.content, name
        assert chunks[-1].choices[0].finish_reason == "length"


def test_health_through_the_ingress_counts_every_replica(endpoint):
    answer = httpx.get(endpoint + "/health", timeout=TIMEOUT)
    assert answer.status_code == 200
    assert answer.json()["replicas_up"] == 2
    assert set(answer.json()["replicas"]) == set(_replica_actors())


def _generated_tokens(url: str) -> dict[str, float]:
    """pxvm_generation_tokens_total of each replica, from /metrics through the ingress."""
    text = httpx.get(url + "/metrics", timeout=TIMEOUT).text
    return {s.labels["replica"]: s.value for family in text_string_to_metric_families(text)
            if family.name == "pxvm_generation_tokens" for s in family.samples
            if s.name == "pxvm_generation_tokens_total"}


def _settled_tokens(url: str) -> dict[str, float]:
    """_generated_tokens once every replica has reported what it did before (two readings
    a report apart agree)."""
    def settled():
        first = _generated_tokens(url)
        time.sleep(1.5 * cluster.REPORT_SECONDS)
        return first if first == _generated_tokens(url) else None
    return _wait(settled, 10, "settled metrics")


def test_metrics_through_the_ingress_count_every_replicas_tokens(endpoint):
    before = _settled_tokens(endpoint)
    assert set(before) == set(_replica_actors())
    client = _client(endpoint)
    served = Counter()
    for _ in range(6):
        answer = client.chat.completions.with_raw_response.create(max_tokens=5, **GREEDY)
        served[answer.headers[cluster.REPLICA_HEADER]] += 5
    # each replica's own count, as the client saw it served (a report is at most a second
    # old; the answering replica's is current)
    seen = {}

    def counted():
        seen.update({r: v - before[r] for r, v in _generated_tokens(endpoint).items()})
        return seen == {r: served[r] for r in before}
    _wait(counted, 10, f"every replica's tokens in /metrics ({seen} for {served})")


class _Stream(threading.Thread):
    """A long streamed chat: which replica took it (known with its first token), then how
    it ended ("length" when whole, else the client's error)."""

    def __init__(self, client: OpenAI, max_tokens: int):
        super().__init__(daemon=True)
        self.client, self.max_tokens = client, max_tokens
        self.replica: str | None = None
        self.streaming = threading.Event()
        self.outcome: str | None = None
        self.tokens = 0

    def run(self) -> None:
        try:
            raw = self.client.chat.completions.with_raw_response.create(
                max_tokens=self.max_tokens, stream=True, **GREEDY)
            self.replica = raw.headers[cluster.REPLICA_HEADER]
            for chunk in raw.parse():
                self.tokens += 1
                self.streaming.set()
                self.outcome = chunk.choices[0].finish_reason or self.outcome
        except Exception as exc:  # the outcome checked: a clear error, not a hang
            self.outcome = f"error: {type(exc).__name__}"
        finally:
            self.streaming.set()


def _replica_actors() -> dict[str, str]:
    """Replica id -> its actor's name (Serve names them SERVE_REPLICA::app#deployment#id)."""
    names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
             if a["namespace"] == "serve" and a["name"].startswith("SERVE_REPLICA::")]
    return {name.rsplit("#", 1)[1]: name for name in names}


def _wait(condition, seconds: float, what: str):
    deadline = time.monotonic() + seconds
    while not (result := condition()):
        assert time.monotonic() < deadline, f"{what} not within {seconds} s"
        time.sleep(0.2)
    return result


def test_a_killed_replica_fails_only_its_own_requests_and_ray_replaces_it(endpoint):
    client = _client(endpoint)
    # long enough to be mid-stream when the kill comes, short enough for the survivor
    streams = [_Stream(client, max_tokens=300) for _ in range(6)]
    for stream in streams:
        stream.start()
    for stream in streams:
        assert stream.streaming.wait(TIMEOUT) and stream.outcome is None, stream.outcome
    held = {s.replica for s in streams}
    assert len(held) == 2, "the least-loaded routing sends six streams to one replica"
    victim = streams[0].replica
    before = _replica_actors()
    assert set(before) == held
    ray.kill(ray.get_actor(before[victim], namespace="serve"), no_restart=True)

    # requests sent after the kill reach the survivor (or the replacement): none fails
    for _ in range(4):
        answer = client.chat.completions.with_raw_response.create(max_tokens=4, **GREEDY)
        assert answer.headers[cluster.REPLICA_HEADER] != victim
        assert answer.parse().choices[0].finish_reason == "length"
    for stream in streams:
        stream.join(TIMEOUT)
        assert not stream.is_alive(), "a stream hung"
    for stream in streams:
        if stream.replica == victim:  # cut off mid-stream: the client sees an error
            assert stream.outcome.startswith("error"), (stream.outcome, stream.tokens)
        else:  # streams that had not reached the killed replica are whole
            assert stream.outcome == "length", stream.outcome

    replaced = _wait(lambda: (a := _replica_actors()) and len(a) == 2 and victim not in a
                     and a, TIMEOUT, "a replacement replica")
    new = (set(replaced) - held).pop()
    _wait(lambda: serve.status().applications[cluster.APP].deployments[cluster.DEPLOYMENT]
          .replica_states == {"RUNNING": 2}, TIMEOUT, "two running replicas")
    seen = set()
    for _ in range(20):  # the replacement serves too (the router picks two at random)
        answer = client.chat.completions.with_raw_response.create(max_tokens=2, **GREEDY)
        seen.add(answer.headers[cluster.REPLICA_HEADER])
        if new in seen:
            break
    assert new in seen and seen <= set(replaced)


def test_the_documented_serve_config_is_valid_and_names_pxvms_deployment():
    from ray.serve.schema import ServeDeploySchema
    config = yaml.safe_load((ROOT / "docs" / "serve-cluster.yaml").read_text())
    schema = ServeDeploySchema.model_validate(config)
    app = schema.applications[0]
    assert app.import_path == "pxvm.serve.cluster:build_app"
    assert [d.name for d in app.deployments] == [cluster.DEPLOYMENT]  # the override applies
    assert isinstance(cluster.build_app(app.args), serve.Application)
    with pytest.raises(cluster.ClusterError, match="max_batchs"):
        cluster.build_app({**app.args, "max_batchs": 8})
