"""LLM runtime: llama-family GGUF models on any pxvm backend, with the tokenizer, chat
template, sampling and streaming generation from the same file."""

from .decode import ContextOverflowError, Decoder
from .gguf_model import Config, GGUFModelFile, ModelFileError, default_model_path
from .model import Model, load_model

__all__ = ["Config", "ContextOverflowError", "Decoder", "GGUFModelFile", "Model",
           "ModelFileError", "default_model_path", "load_model"]
