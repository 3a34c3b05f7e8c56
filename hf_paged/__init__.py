"""hf_paged: paged KV cache, prefix sharing, KV compression, constrained decoding and continuous batching for
Hugging Face transformers causal LMs.

    model = hf_paged.wrap(model)          # same object; generate / generate_batch run on the paged engine
    hf_paged.engine_of(model).stats()     # the engine: add_request / step / stream / abort / stats
    hf_paged.unwrap(model)                # back to stock
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hf_paged import errors
from hf_paged.config import PagedConfig
from hf_paged.lazy import lazy_attributes

__version__ = "0.1.0"

# Heavy modules (torch, transformers) load on first attribute access, so `import hf_paged` stays cheap.
_LAZY = {
    "wrap": "hf_paged.wrapping",
    "unwrap": "hf_paged.wrapping",
    "engine_of": "hf_paged.wrapping",
    "is_wrapped": "hf_paged.wrapping",
    "PagedCache": "hf_paged.cache.paged_cache",
    "PagedLayer": "hf_paged.cache.paged_cache",
    "Engine": "hf_paged.batching.engine",
    "SamplingParams": "hf_paged.batching.sampling",
    "RequestOutput": "hf_paged.batching.request",
    "RequestStatus": "hf_paged.batching.request",
    "JSONSchemaLogitsProcessor": "hf_paged.processors",
    "RegexLogitsProcessor": "hf_paged.processors",
    "ChoiceLogitsProcessor": "hf_paged.processors",
    "GrammarLogitsProcessor": "hf_paged.processors",
    "default_model": "hf_paged.models",
    "PagedFallbackWarning": "hf_paged.generate",
    "IncompleteDocumentWarning": "hf_paged.generate",
}

__all__ = ["PagedConfig", "errors", *_LAZY]  # noqa: PLE0604 -- the lazy names are strings


__getattr__ = lazy_attributes(__name__, _LAZY)


if TYPE_CHECKING:  # pragma: no cover
    from hf_paged.batching.engine import Engine as Engine
    from hf_paged.batching.request import RequestOutput as RequestOutput
    from hf_paged.batching.request import RequestStatus as RequestStatus
    from hf_paged.batching.sampling import SamplingParams as SamplingParams
    from hf_paged.cache.paged_cache import PagedCache as PagedCache
    from hf_paged.cache.paged_cache import PagedLayer as PagedLayer
    from hf_paged.wrapping import engine_of as engine_of
    from hf_paged.wrapping import is_wrapped as is_wrapped
    from hf_paged.wrapping import unwrap as unwrap
    from hf_paged.wrapping import wrap as wrap
