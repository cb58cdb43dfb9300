"""The LMSP local model service: any GGUF model over LMSP 1.0 (CPython only).

Serves LMSP 1.0 section 6 (responses, streaming, tool calls) plus the parts
napllm assumes for the sections it lacks (model listing, tasks with
resumable events, RFC 9457 problems, bearer token), as documented in
`docs/lmsp.md`. Inference runs on llama-cpp-python in a supervised model
worker process (engine.py, worker.py and the modules below them); HTTP on Starlette, uvicorn and
sse-starlette; stored responses and tasks persist in SQLite (store.py).
Start it with `napllm-lmsp --model PATH.gguf`.
"""
