"""LLM runtime: llama-family GGUF models on any pxvm backend, with the tokenizer, chat
template, sampling and streaming generation from the same file."""

from .gguf_model import Config, GGUFModelFile, ModelFileError, default_model_path
from .model import ContextOverflowError, Model, load_model

__all__ = ["Config", "ContextOverflowError", "GGUFModelFile", "Model", "ModelFileError",
           "default_model_path", "load_model"]
