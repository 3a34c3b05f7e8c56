"""Scoring on the paged engine: the log-probability of a continuation after a context, and of whole documents in
rolling windows (perplexity), as evaluation harnesses ask for them (lm-evaluation-harness's `loglikelihood` and
`loglikelihood_rolling`).

    model = hf_paged.wrap(model)
    model.loglikelihood([(context_ids, continuation_ids), ...])     # -> [Loglikelihood(logprob, is_greedy), ...]
    model.loglikelihood_rolling([document_ids, ...])                # -> one summed Loglikelihood per document

Each pair runs as one scoring request (`SamplingParams.score_targets`) in the continuous batch: the prompt is the
context and all but the last continuation token, and the logits of its last len(continuation) positions give the
continuation's log-probabilities (log-softmax in fp32). Pairs that share a context share its blocks: the first pair
of each context (its leader) runs first, and the others are submitted with the next wave, when the context's full
blocks are in the prefix cache; only the context's last partial block and the continuation are computed again.

    wave 1: leaders of group batch 1
    wave 2: followers of batch 1 + leaders of batch 2      (a batch: as many contexts as half the pool holds)
    ...
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass

from hf_paged.api.autocast import refuse_mixed_precision_forward
from hf_paged.batching.progress import progress_hook
from hf_paged.batching.request import RequestStatus
from hf_paged.batching.sampling import SamplingParams
from hf_paged.errors import HfPagedError, InvalidPromptError, RequestFailedError

__all__ = ["Loglikelihood", "loglikelihood", "loglikelihood_rolling", "rolling_windows"]


@dataclass(frozen=True, slots=True)
class Loglikelihood:
    """A continuation's summed log-probability (natural log), whether greedy decoding would produce it token by
    token, and each token's log-probability when asked (`token_logprobs=True`)."""

    logprob: float
    is_greedy: bool
    token_logprobs: list[float] | None = None


def loglikelihood(model, requests: Sequence[tuple[Sequence[int], Sequence[int]]], *, token_logprobs: bool = False,
                  progress_bar: bool = False) -> list[Loglikelihood]:
    """Score `(context_ids, continuation_ids)` pairs on a wrapped model's engine, in input order.

    The context needs at least one token (begin with the BOS id, or the EOS id for a model without one, as
    lm-evaluation-harness does), the continuation too; context + continuation minus its last token must fit the
    model's positions (cut the context from the left, or use `loglikelihood_rolling`). Equal to a stock forward over
    `context + continuation[:-1]` (fp32: within 1e-4).

    Raises:
        InvalidPromptError: a pair that is not two lists of token ids of this model, or an empty side.
        PromptTooLongError: a pair longer than the model's positions (or the KV pool).
        RequestFailedError (or the typed error behind it): a request that failed in the engine.
    """
    from hf_paged.api.wrap_state import engine_of

    refuse_mixed_precision_forward(model, "loglikelihood")
    engine = engine_of(model)
    pairs = [_check_pair(engine, i, pair) for i, pair in enumerate(requests)]
    results: list[Loglikelihood | None] = [None] * len(pairs)
    with progress_hook(engine, len(pairs), enabled=progress_bar, verb="Scoring", prompts=True) as on_step:
        for wave in _waves(pairs, _wave_tokens(engine)):
            prompts = [pairs[i].context + pairs[i].continuation[:-1] for i in wave]
            outputs = engine.loop.submit(prompts, [pairs[i].params for i in wave]).result(on_step)
            for i, output in zip(wave, outputs.values()):
                results[i] = _result(i, output, token_logprobs)
    return results


def loglikelihood_rolling(model, documents: Sequence[Sequence[int]], *, max_length: int | None = None,
                          prefix_token_id: int | None = None, token_logprobs: bool = False,
                          progress_bar: bool = False) -> list[Loglikelihood]:
    """Score whole documents (perplexity): each is cut into disjoint windows of at most `max_length` tokens (default:
    the model's positions), the first one after `prefix_token_id` (default: the model's BOS id, else its EOS id), the
    later ones after as much of the preceding text as fits, as lm-evaluation-harness's `loglikelihood_rolling` does.
    Returns each document's summed log-probability over all its tokens; `is_greedy` is True when every token was."""
    from hf_paged.api.wrap_state import engine_of

    engine = engine_of(model)
    max_length = engine.max_model_len if max_length is None else max_length
    if isinstance(max_length, bool) or not isinstance(max_length, int) or not 1 <= max_length <= engine.max_model_len:
        raise ValueError(f"max_length must be an int in [1, {engine.max_model_len}] (the model's positions), got "
                         f"{max_length!r}")
    prefix = _prefix_token(model) if prefix_token_id is None else prefix_token_id
    if isinstance(prefix, bool) or not isinstance(prefix, int) or not 0 <= prefix < engine.vocab_size:
        raise InvalidPromptError(f"prefix_token_id={prefix!r} is no token id of this model (its vocabulary is [0, "
                                 f"{engine.vocab_size})); give its BOS or EOS id, or leave it None")
    pairs, owner = [], []
    for d, document in enumerate(documents):
        tokens = _token_list(document, f"document {d}")
        if not tokens:
            raise InvalidPromptError(f"document {d} is empty: a rolling log-likelihood needs at least one token")
        bad = [t for t in tokens if not 0 <= t < engine.vocab_size]
        if bad:  # (found here, not in a window's request: its index would name the window, not the document)
            raise InvalidPromptError(f"document {d}: token ids {bad[:5]} are outside the vocabulary [0, "
                                     f"{engine.vocab_size})")
        for window in rolling_windows(tokens, prefix, max_length):
            pairs.append(window)
            owner.append(d)
    scored = loglikelihood(model, pairs, token_logprobs=True, progress_bar=progress_bar)
    per_doc: list[list[Loglikelihood]] = [[] for _ in documents]
    for d, result in zip(owner, scored):
        per_doc[d].append(result)
    out = []
    for parts in per_doc:
        tokens = [lp for part in parts for lp in part.token_logprobs]
        out.append(Loglikelihood(sum(part.logprob for part in parts), all(part.is_greedy for part in parts),
                                 tokens if token_logprobs else None))
    return out


def rolling_windows(tokens: Sequence[int], prefix_token_id: int, max_length: int) -> list[tuple[list[int], list[int]]]:
    """Disjoint `(context, continuation)` windows that together predict every token once: the first predicts up to
    `max_length` tokens after `prefix_token_id`; each later one predicts the next `max_length` tokens (fewer at the
    end) after the tokens just before them, context + continuation - 1 <= `max_length` tokens in all."""
    tokens = list(tokens)
    first = min(max_length, len(tokens))
    windows = [([prefix_token_id], tokens[:first])]
    done = first
    while done < len(tokens):
        n = min(len(tokens) - done, max_length)
        end = done + n
        context = tokens[max(end - max_length - 1, 0) : done]
        windows.append((context, tokens[done:end]))
        done = end
    return windows


# -- internals --------------------------------------------------------------------------------------------------
def _token_list(ids, what: str) -> list[int]:
    if isinstance(ids, str | bytes):
        raise InvalidPromptError(f"{what} is text ({ids[:20]!r}...); encode it first, e.g. tokenizer(text).input_ids")
    if isinstance(ids, dict):  # (a tokenizer's output: its input_ids are the list)
        raise InvalidPromptError(f"{what} is a dict (keys {list(ids)[:3]}); give its token ids, e.g. "
                                 "tokenizer(text).input_ids")
    try:
        values = ids.tolist() if hasattr(ids, "tolist") else list(ids)
    except TypeError:
        raise InvalidPromptError(f"{what} is not a list of token ids ({type(ids).__name__})") from None
    out = []
    for t in values:
        try:
            if isinstance(t, bool):  # True would score token 1
                raise TypeError
            out.append(operator.index(t))
        except TypeError:
            raise InvalidPromptError(
                f"{what} is not a list of token ids ({type(ids).__name__}): it holds {t!r} ({type(t).__name__}), not "
                "a token id; give ints, e.g. tokenizer(text).input_ids"
            ) from None
    return out


@dataclass(frozen=True, slots=True)
class _Pair:
    """A checked `(context, continuation)` request and its scoring request's params (built and checked once)."""

    context: list[int]
    continuation: list[int]
    params: SamplingParams


def _check_pair(engine, i: int, pair) -> _Pair:
    if isinstance(pair, dict | str | bytes):  # (unpacking would take a dict's keys, or a text's characters)
        raise InvalidPromptError(f"request {i} is a {type(pair).__name__}, not a (context_ids, continuation_ids) pair")
    try:
        context, continuation = pair
    except (TypeError, ValueError):
        raise InvalidPromptError(f"request {i} is not a (context_ids, continuation_ids) pair") from None
    context, continuation = _token_list(context, f"context {i}"), _token_list(continuation, f"continuation {i}")
    if not continuation:
        raise InvalidPromptError(f"continuation {i} is empty: there is nothing to score; give at least one token")
    if not context:
        raise InvalidPromptError(
            f"context {i} is empty: the first continuation token needs a token before it; begin the context with "
            "the BOS id (or the EOS id for a model without one)"
        )
    bad = [t for t in context + continuation if not 0 <= t < engine.vocab_size]
    if bad:  # the last continuation token is no prompt token: the engine's prompt check would not see it
        raise InvalidPromptError(f"request {i}: token ids {bad[:5]} are outside the vocabulary [0, "
                                 f"{engine.vocab_size})")
    params = SamplingParams(max_new_tokens=1, score_targets=continuation)
    error = engine.validate_prompt(context + continuation[:-1], params)
    if error is not None:
        raise type(error)(f"request {i}: {error}")
    return _Pair(context, continuation, params)


def _wave_tokens(engine) -> int:
    """Tokens of leaders per wave: half the pool, so a batch's contexts stay cached until their followers run."""
    return max(engine.cache.num_blocks * engine.config.block_size // 2, 1)


def _waves(pairs: list[_Pair], budget: int) -> list[list[int]]:
    """Request indices per submission: the first pair of each context leads; the others follow one wave later."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, pair in enumerate(pairs):
        groups.setdefault(tuple(pair.context), []).append(i)
    batches: list[list[list[int]]] = [[]]
    tokens = 0
    for members in groups.values():
        size = len(pairs[members[0]].context) + len(pairs[members[0]].continuation)
        if batches[-1] and tokens + size > budget:
            batches.append([])
            tokens = 0
        batches[-1].append(members)
        tokens += size
    waves = []
    for b in range(len(batches) + 1):
        followers = [i for members in batches[b - 1] for i in members[1:]] if b else []
        leaders = [members[0] for members in batches[b]] if b < len(batches) else []
        if followers or leaders:
            waves.append(followers + leaders)
    return waves


def _result(i: int, output, token_logprobs: bool) -> Loglikelihood:
    if output.status is not RequestStatus.FINISHED:
        error_type = output.error_type if isinstance(output.error_type, type) and issubclass(
            output.error_type, HfPagedError) else RequestFailedError
        raise error_type(f"scoring request {i} failed: {output.error}")
    logprobs = output.score_logprobs
    return Loglikelihood(float(sum(logprobs)), all(output.score_greedy), list(logprobs) if token_logprobs else None)


def _prefix_token(model) -> int:
    config = model.generation_config
    for token in (config.bos_token_id, getattr(model.config, "bos_token_id", None), config.eos_token_id,
                  getattr(model.config, "eos_token_id", None)):
        if isinstance(token, list | tuple):
            token = token[0] if token else None
        if token is not None:
            return int(token)
    raise ValueError("the model names no BOS or EOS token: pass prefix_token_id= (the token before a document)")
