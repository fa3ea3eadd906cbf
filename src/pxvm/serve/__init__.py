"""`pxvm serve --model`: an OpenAI-compatible HTTP API over pxvm.llm.engine's continuous
batching (app.py has the routes, service.py the glue to the engine, server.py uvicorn)."""
