"""The seeds' `pixel_llm` namespace: compatibility entry points over pxvm."""
