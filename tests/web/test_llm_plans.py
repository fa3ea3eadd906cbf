"""The browser language model's plans (pxvm/web/llm_plans.py) and routes (llm_routes.py):
the byte ranges a plan names for its weight buffers hold exactly the bytes pxvm's Model
uploads from the real file; requests that are not a model's header and vectors, or name a
type pxvm does not run, are refused with one clear message; prompts and token ids round-trip
through the server's tokenizer. The page running the plans is test_llm_page.py's."""

from __future__ import annotations

import base64
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "llm"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "serve"))
from make_tiny_gguf import TinySpec, write_tiny_gguf  # noqa: E402
from tiny_chat_model import write_tiny_chat_model  # noqa: E402

from pxvm.core.errors import PxvmError  # noqa: E402
from pxvm.llm.gguf_model import GGUFModelFile  # noqa: E402
from pxvm.llm.gguf_scan import ModelFileError, scan  # noqa: E402
from pxvm.llm.model import Model  # noqa: E402
from pxvm.web.llm_plans import (MAX_FILE_BYTES, BrowserModel, BrowserModelError,  # noqa: E402
                                ModelPlanBackend, ModelPlanDevice, vector_tensors)
from pxvm.web.llm_routes import BrowserModels, llm_post  # noqa: E402

BINDING = 128 << 20


def page_request(path) -> tuple[bytes, int]:
    """What the page sends for the file at `path`: its header, then its vectors."""
    raw = Path(path).read_bytes()
    header = scan(raw, str(path))
    vectors = b"".join(raw[t.offset:t.offset + t.n_bytes] for t in vector_tensors(header))
    return raw[:header.data_offset] + vectors, len(raw)


@pytest.mark.parametrize("spec", [
    TinySpec(arch="llama", tied_output=False),
    TinySpec(arch="qwen2", matrix_type="Q4_0"),  # Q, K and V biases joined into one vector
    TinySpec(dim=256, ffn_dim=256, matrix_type="Q4_K",  # types mixed inside a layer
             matrix_types={"attn_v": "Q6_K", "ffn_up": "Q6_K"}),
], ids=["llama", "qwen2", "q4_k-mixed"])
def test_weight_byte_ranges_hold_the_bytes_the_model_uploads(tmp_path, rng, spec):
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path, spec, rng)
    body, size = page_request(path)
    browser = BrowserModel(body, size, "tiny.gguf", (), BINDING)
    plan = browser.plan()
    # the same Model loaded from the real file: every upload is recorded as its bytes
    device = ModelPlanDevice((), [], {}, software=False)
    Model(GGUFModelFile(str(path)), ModelPlanBackend(device, BINDING), progress=False,
          max_context=browser.model.context_length)
    uploaded = device.buffer_json()
    raw = path.read_bytes()
    tensors = scan(raw, "tiny").tensors
    weights = [i for i, b in enumerate(plan["buffers"]) if b["kind"] == "weight"]
    assert len(weights) >= 4 * spec.n_layers + 1  # [Wq; Wk; Wv], Wo, [Wgate; Wup], Wdown, the table
    for i in weights:
        segments = plan["buffers"][i]["segments"]
        got = b"".join(raw[tensors[n].offset + a:tensors[n].offset + a + k] for n, a, k in segments)
        assert got == base64.b64decode(uploaded[i]["data"]), segments
    # vectors and the rest are the same data or zeros alike
    for mine, real in zip(plan["buffers"], uploaded):
        if mine["kind"] != "weight":
            assert mine == real


def test_plan_has_a_decoding_step_per_key_bound_and_prompt_plans_add_buffers(tmp_path, rng):
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path, TinySpec(context_length=300), rng)
    browser = BrowserModel(*page_request(path), "tiny.gguf", ("subgroup",), BINDING)
    plan = browser.plan()
    assert [s["bound"] for s in plan["steps"]] == [64, 256, 300]
    assert plan["steps"][0]["dispatches"][0] == 0
    assert plan["steps"][-1]["dispatches"][1] == len(plan["dispatches"])
    kernels = {d["kernel"] for d in plan["dispatches"]}
    assert "matmul_quant_subgroups.wgsl" in kernels
    piece = browser.prompt_plan(5, 7)
    assert piece["first_buffer"] == len(plan["buffers"])
    assert piece["tokens"] >= piece["first_buffer"] and piece["dispatches"]
    # a piece's buffers are its own: the next one numbers its own from the same place,
    # and the server keeps nothing of either (a page asking again and again grows nothing)
    again = browser.prompt_plan(9, 0)
    assert again["first_buffer"] == piece["first_buffer"]
    assert browser.plan()["buffers"] == plan["buffers"]
    assert len(browser.plan()["dispatches"]) == len(plan["dispatches"])
    # without subgroups, the plain kernels
    plain = BrowserModel(*page_request(path), "tiny.gguf", (), BINDING).plan()
    assert not [d for d in plain["dispatches"] if "subgroups" in d["kernel"]]
    with pytest.raises(BrowserModelError, match="do not fit"):
        browser.prompt_plan(10, 295)


def test_a_request_that_is_not_the_header_and_vectors_is_refused(tmp_path, rng):
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path, TinySpec(), rng)
    body, size = page_request(path)
    with pytest.raises(BrowserModelError, match="vectors take"):
        BrowserModel(body[:-4], size, "tiny.gguf", (), BINDING)
    with pytest.raises(ModelFileError, match="not a GGUF file"):
        BrowserModel(b"GGML" + body[4:], size, "tiny.gguf", (), BINDING)
    with pytest.raises(ModelFileError, match="past the end of the file"):
        BrowserModel(body, size - 100, "tiny.gguf", (), BINDING)
    with pytest.raises(BrowserModelError, match="the page runs models of"):
        BrowserModel(body, MAX_FILE_BYTES + 1, "tiny.gguf", (), BINDING)


def test_an_unsupported_tensor_type_is_refused_naming_it(tmp_path, rng):
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path, TinySpec(matrix_type="Q4_0"), rng)
    raw = bytearray(path.read_bytes())
    header = scan(bytes(raw), "tiny")
    # blk.0.attn_q's GGML type (the u32 before its u64 offset) rewritten as IQ4_NL (20),
    # whose blocks are Q4_0's size: a valid file of a type pxvm does not run
    name = b"blk.0.attn_q.weight"
    at = raw.index(len(name).to_bytes(8, "little") + name) + 8 + len(name)
    n_dims = int.from_bytes(raw[at:at + 4], "little")
    type_at = at + 4 + 8 * n_dims
    assert int.from_bytes(raw[type_at:type_at + 4], "little") == header.tensors[name.decode()].ggml_type
    raw[type_at:type_at + 4] = (20).to_bytes(4, "little")
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(bytes(raw))
    with pytest.raises(ModelFileError, match="IQ4_NL, which pxvm does not support"):
        BrowserModel(*page_request(bad), "bad.gguf", (), BINDING)


def test_a_model_over_the_pages_binding_limit_is_refused_naming_the_limit(tmp_path, rng):
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path, TinySpec(context_length=96), rng)  # a layer's cache: 6,144 bytes
    with pytest.raises(PxvmError, match="maxStorageBufferBindingSize and maxBufferSize: 4,096"):
        BrowserModel(*page_request(path), "tiny.gguf", (), 4096)


def _post(models, route, query, body=b""):
    status, answer, _ = llm_post(route.split("/"), {k: [str(v)] for k, v in query.items()},
                                 body, models)
    return status, json.loads(answer)


def test_routes_load_encode_decode_and_refuse_bad_requests(tmp_path):
    path = write_tiny_chat_model(tmp_path / "chat.gguf")
    body, size = page_request(path)
    models = BrowserModels(str(path))
    status, plan = _post(models, "load", {"size": size, "max_binding": BINDING}, body)
    assert status == 200 and plan["vocab_size"] > 256 and plan["stop_ids"]
    model = plan["model"]
    messages = {"messages": [{"role": "user", "content": "the other"}]}
    status, encoded = _post(models, "encode", {"model": model}, json.dumps(messages).encode())
    assert status == 200
    # the prompt ends with the user's text, its assistant turn opened (the file has no
    # template: pxvm's ChatML default)
    status, decoded = _post(models, "decode", {"model": model},
                            json.dumps({"ids": encoded["ids"]}).encode())
    assert status == 200 and "the other" in decoded["text"]
    assert _post(models, "prompt", {"model": model, "tokens": 3, "position": 0})[0] == 200
    assert _post(models, "prompt", {"model": "nope", "tokens": 3, "position": 0})[0] == 404
    status, answer = _post(models, "decode", {"model": model}, b'{"ids": [-1]}')
    assert status == 400 and "token ids" in answer["error"]
    status, answer = _post(models, "load", {"size": size, "max_binding": 5}, body)
    assert status == 400 and "max_binding" in answer["error"]
    status, answer = _post(models, "load", {"size": size, "max_binding": BINDING}, b"GGUF")
    assert status == 400 and "GGUF version 0" in answer["error"]
    status, answer = _post(models, "load", {"size": size, "max_binding": BINDING}, body[:-1])
    assert status == 400 and "the request holds" in answer["error"]


def test_server_streams_its_model_to_the_page_only_with_the_session_token(tmp_path):
    import http.client

    from pxvm.serve.page import Page
    from pxvm.serve.server import HttpServer
    from pxvm.web import httpd

    path = write_tiny_chat_model(tmp_path / "chat.gguf")
    srv = HttpServer(None, page=Page(llm_model=str(path))).start()

    def get(route, headers=None):
        conn = http.client.HTTPConnection(*srv.server_address[:2], timeout=30)
        try:
            conn.request("GET", route, headers=headers or {})
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()
    try:
        status, info = get("/api/llm/info")
        assert status == 200
        assert json.loads(info)["server_model"]["size"] == path.stat().st_size
        assert get("/api/llm/model.gguf")[0] == 403  # no token: no other site's page
        token = json.loads(get("/api/info")[1])["session"]
        status, data = get("/api/llm/model.gguf", {httpd.SESSION_HEADER: token})
        assert status == 200 and data == path.read_bytes()
    finally:
        srv.stop()
