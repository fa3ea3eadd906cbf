"""Generate text with the default model (SmolLM2-135M-Instruct) on the chosen backend:

    python -m pxvm.examples.generate_text [--backend auto|gpu|cpu] [--prompt TEXT]

The prompt goes through the model's chat template; the reply streams as it is generated,
then the prefill and generation speeds and the device are printed."""

from __future__ import annotations

import argparse
import sys

from pxvm.llm import load_model
from pxvm.llm.generate import generate
from pxvm.llm.tokenizer import Tokenizer
from pxvm.core.errors import PxvmError


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("auto", "gpu", "cpu"), default="auto")
    parser.add_argument("--prompt", default="What is the capital of France?")
    parser.add_argument("--model", default=None, help="a .gguf file (default: SmolLM2-135M)")
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args(argv)
    try:
        model = load_model(args.model, backend=args.backend, progress=sys.stderr.isatty(),
                           warm_up=True)
        tokenizer = Tokenizer(model.metadata)
        print(f"{model.backend_name} backend on {model.device_name}")
        print(f"> {args.prompt}")
        result = generate(model, tokenizer, args.prompt, max_tokens=args.max_tokens, chat=True,
                          stream=lambda piece: print(piece, end="", flush=True))
    except PxvmError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print()
    print(f"prompt: {result.prompt_tokens} tokens at {result.prompt_tokens_per_s:.1f} tokens/s; "
          f"generation: {result.generated_tokens} tokens at "
          f"{result.generation_tokens_per_s:.1f} tokens/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
