"""`hf-paged serve`: an OpenAI-compatible HTTP server over one engine loop (needs the `hf_paged[serve]` extra).

    app = hf_paged.serving.build_app(engine, tokenizer, ServerSettings(model_name="my-model", max_waiting=256))
    uvicorn.run(app, host="127.0.0.1", port=8000)        # or: hf-paged serve --model PATH

Loaded lazily: `hf_paged.serving.server` (the command line) imports without FastAPI installed.
"""

from __future__ import annotations

__all__ = ["ServerSettings", "build_app"]


def __getattr__(name: str):
    if name not in __all__:
        raise AttributeError(f"module 'hf_paged.serving' has no attribute {name!r}")
    try:
        from hf_paged.serving import app
    except ImportError as exc:
        raise ImportError(
            f"hf_paged.serving needs the serve extra ({exc.name} is missing): pip install 'hf_paged[serve]'"
        ) from None
    return getattr(app, name)
