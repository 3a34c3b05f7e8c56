"""Prefill/decode disaggregation: what a replica's role changes (its KV connector) and what a prefill is asked.

    gateway --(body: max_tokens=1, n=1, no stream, no constraint)--> prefill replica: computes the prompt; its
        connector writes every block its prefix cache takes into Ray's object store (`RayObjectStore`, a writer);
        `EngineReplica.prefill` registers them with the directory before it answers
    gateway --(the request as sent)--> decode replica (chosen by the cache-aware router): its connector finds the
        prompt's blocks past its own prefix hit in the directory, loads them, computes the last partial block and the
        last token, and decodes as in colocated mode (streaming, `n`, constraints, cancellation, metrics)

As vLLM's disaggregated-prefill proxies do, the prefill's first token is not carried over: the decode side computes
the logits of the prompt's last token itself (a block never holds it: its logits are needed), so its first token and
a constraint's state follow from its own computation, and greedy output is the one engine's. A prefill that failed
(its replica died, a bad request) only leaves blocks missing: the decode replica recomputes them, and a bad request
gets its error from the decode replica. Blocks nobody collects leave the object store by the directory's lease
(counts of blocks and bytes), sized to one engine's pool (`num_blocks`): a handed-over block is needed only until the
decode replica loads it, and an unbounded directory kept every block ever prefilled in the object store (the PD soak,
`benchmarks/pd_soak_results.md`: both replicas' RSS +18% over 2,000 requests); a block evicted before it was
collected is recomputed on the decode side and counted in the directory's stats.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hf_paged.batching.engine import Engine
    from hf_paged.kv_transfer.ray_store import RayObjectStore

__all__ = ["KV_ROLES", "attach_kv_role", "prefill_body"]

KV_ROLES = ("prefill", "decode")

# Fields that shape the answer, not the prompt: a prefill drops them (a constraint would be compiled for one token)
_ANSWER_ONLY = ("max_completion_tokens", "stream_options", "response_format", "guided_json", "guided_regex",
                "guided_choice", "guided_grammar", "guided_whitespace_pattern", "guided_number_digits", "logprobs",
                "top_logprobs", "min_tokens", "best_of", "logit_bias", "echo", "prompt_logprobs_start")


def attach_kv_role(engine: Engine, role: str, directory: str) -> RayObjectStore:
    """Give `engine` the connector of its role over the object store `directory`: a prefill replica writes every
    block its prefix cache takes (and never looks for others'); a decode replica reads (it writes nothing)."""
    from hf_paged.kv_transfer.connector import KVConnector
    from hf_paged.kv_transfer.ray_store import RayObjectStore

    if role not in KV_ROLES:
        raise ValueError(f"kv_role must be one of {list(KV_ROLES)} or None, got {role!r}")
    store = RayObjectStore(directory, sync_on_miss=role == "decode", max_blocks=engine.cache.num_blocks)
    with engine.lock:  # the loop thread may be stepping: swap the connector between steps
        engine.scheduler.kv_transfer = KVConnector(engine.cache, engine.model, store,
                                                   save_on="store" if role == "prefill" else "never")
    return store


def prefill_body(body: bytes) -> bytes | None:
    """The body a prefill replica gets: the same prompt, one token, one choice, no stream, no constraint. None when
    the body is not a JSON object (the decode replica answers it with the error)."""
    try:
        request: Any = json.loads(body)
    except (ValueError, RecursionError):  # not JSON, or nested past the parser's depth: the decode side's 400
        return None
    if not isinstance(request, dict):
        return None
    for key in _ANSWER_ONLY:
        request.pop(key, None)
    request.update(max_tokens=1, n=1, stream=False)
    return json.dumps(request).encode()
