"""Core entry points of the seeds' `pixel_llm` package."""
