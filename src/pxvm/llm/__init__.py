"""LLM runtime: llama-family GGUF models on any pxvm backend, with the tokenizer, chat
template, sampling and streaming generation from the same file."""

from .decode import ContextOverflowError, Decoder
from .gguf_model import Config, GGUFModelFile, ModelFileError, default_model_path
from .model import (DEFAULT_MAX_CONTEXT, KV_CACHE_CHOICES, ContextSizeError, KVCacheTypeError,
                    Model, load_model, open_model_file)
from .weights import MEMORY_SHARE, ModelDoesNotFitError, WeightRowTooLargeError

__all__ = ["DEFAULT_MAX_CONTEXT", "KV_CACHE_CHOICES", "Config", "ContextOverflowError",
           "ContextSizeError", "Decoder", "GGUFModelFile", "KVCacheTypeError", "MEMORY_SHARE",
           "Model", "ModelDoesNotFitError", "ModelFileError", "WeightRowTooLargeError",
           "default_model_path", "load_model", "open_model_file"]
