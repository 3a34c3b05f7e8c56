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
from hf_paged.lazy import ModuleAliases, lazy_attributes

__version__ = "0.1.0"

# Heavy modules (torch, transformers) load on first attribute access, so `import hf_paged` stays cheap.
_LAZY = {
    "wrap": "hf_paged.api.wrapping",
    "unwrap": "hf_paged.api.wrapping",
    "engine_of": "hf_paged.api.wrapping",
    "is_wrapped": "hf_paged.api.wrapping",
    "PagedCache": "hf_paged.cache.paged_cache",
    "PagedLayer": "hf_paged.cache.paged_cache",
    "Engine": "hf_paged.batching.engine",
    "SamplingParams": "hf_paged.batching.sampling",
    "RequestOutput": "hf_paged.batching.request",
    "RequestStatus": "hf_paged.batching.request",
    "TokenLogprobs": "hf_paged.batching.logprobs",
    "JSONSchemaLogitsProcessor": "hf_paged.processors",
    "RegexLogitsProcessor": "hf_paged.processors",
    "ChoiceLogitsProcessor": "hf_paged.processors",
    "GrammarLogitsProcessor": "hf_paged.processors",
    "default_model": "hf_paged.api.models",
    "PagedFallbackWarning": "hf_paged.api.generate",
    "IncompleteDocumentWarning": "hf_paged.api.generate",
    "weights_changed": "hf_paged.batching.weights",
}

__all__ = ["PagedConfig", "errors", *_LAZY]  # noqa: PLE0604 -- the lazy names are strings


__getattr__ = lazy_attributes(__name__, _LAZY)

# Modules that moved into api/ and cli/ (issue 38) keep their old paths: `import hf_paged.generate` gives the same
# module object as `import hf_paged.api.generate`.
ModuleAliases.install({
    "hf_paged.wrapping": "hf_paged.api.wrapping",
    "hf_paged.wrap_state": "hf_paged.api.wrap_state",
    "hf_paged.generate": "hf_paged.api.generate",
    "hf_paged.generate_criteria": "hf_paged.api.generate_criteria",
    "hf_paged.generate_output": "hf_paged.api.generate_output",
    "hf_paged.generate_processors": "hf_paged.api.generate_processors",
    "hf_paged.scoring": "hf_paged.api.scoring",
    "hf_paged.models": "hf_paged.api.models",
    "hf_paged.cli_common": "hf_paged.api.loading",
    "hf_paged.cli_bench": "hf_paged.cli.bench",
    "hf_paged.cli_eval": "hf_paged.cli.eval",
    "hf_paged.demo": "hf_paged.cli.demo",
    "hf_paged.workloads": "hf_paged.cli.workloads",
    "hf_paged.datasets": "hf_paged.cli.datasets",
})


if TYPE_CHECKING:  # pragma: no cover
    from hf_paged.api.wrapping import engine_of as engine_of
    from hf_paged.api.wrapping import is_wrapped as is_wrapped
    from hf_paged.api.wrapping import unwrap as unwrap
    from hf_paged.api.wrapping import wrap as wrap
    from hf_paged.batching.engine import Engine as Engine
    from hf_paged.batching.logprobs import TokenLogprobs as TokenLogprobs
    from hf_paged.batching.request import RequestOutput as RequestOutput
    from hf_paged.batching.request import RequestStatus as RequestStatus
    from hf_paged.batching.sampling import SamplingParams as SamplingParams
    from hf_paged.batching.weights import weights_changed as weights_changed
    from hf_paged.cache.paged_cache import PagedCache as PagedCache
    from hf_paged.cache.paged_cache import PagedLayer as PagedLayer
