"""`SamplingParams`: how one request picks its tokens and when it stops."""

from __future__ import annotations

import numbers
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

from hf_paged.batching.constraint_protocol import is_constraint
from hf_paged.batching.logprobs import check_logprobs
from hf_paged.batching.penalties import check_logit_bias, check_penalty
from hf_paged.errors import InvalidConfigError

# Most tokens drafted per step: a verification chunk of 1 + 15 queries still runs the in-place CPU attention
# kernels (chunks of up to 16 queries a sequence); past that the step would fall back to the gather path.
MAX_SPECULATIVE_TOKENS = 15

# How a constrained request is held to its constraint (`batching/constraint_modes.py`).
CONSTRAINT_MODES = ("mask", "resample")


MAX_RETRIES = 100  # reruns of one request at most (each a whole generation)


@dataclass(slots=True)
class SamplingParams:
    """Per-request decoding settings.

    Args:
        max_new_tokens: most tokens to generate.
        do_sample: sample (True) or take the argmax (False, greedy).
        temperature, top_k, top_p: the usual warpers (applied after the logits processors, as in `generate`).
        min_p: drop the tokens less likely than `min_p` times the most likely one (0: off), after temperature and
            before top-k/top-p (vLLM's order; stock `generate` applies its min_p last, from its own list).
        seed: seed of this request's own draws: its tokens depend on the prompt, these parameters and the seed,
            not on the batch around it, the schedule, the cache, speculative decoding or `constraint_mode`
            (`seeded_draws.py`; the model's logits must be the same, see README "Sampling and seeds").
        eos_token_id: id or ids that end the request (they are kept in the output, like `generate`).
        stop_strings: strings that end the request once the decoded output contains one (needs `tokenizer`).
        logits_processors: transformers `LogitsProcessor`s; each gets this request's own history as input_ids.
        processor_prompt_ids: the prompt as `logits_processors` see it in that history (None: the prompt itself).
            `generate` gives each row as stock's processors see it, its padding included (stock's min_length,
            no_repeat_ngram_size, repetition_penalty read the padded rows).
        num_return_sequences: independent continuations of the same prompt (they share the prompt's blocks).
        min_new_tokens: EOS is suppressed before this many tokens, and no stop string ends within them (vLLM's
            min_tokens; `generate` keeps stock's rule, where only EOS waits).
        num_speculative_tokens: speculative decoding: tokens drafted per step and checked by the model in one
            forward (0: off). Greedy output is unchanged; sampled output keeps the model's distribution.
        draft_model: who drafts them: None for prompt lookup (n-grams of the request's own tokens), or a smaller
            causal LM with the same tokenizer (run with its own paged cache).
        prompt_lookup_max_ngram: longest n-gram prompt lookup matches (the longest match wins).
        constraint_mode: how a constraint (JSON schema, regex, choices) is enforced: "mask" (default) masks the
            vocabulary at every step; "resample" draws from the unconstrained distribution and computes the mask
            only when the draw is refused. Same output distribution (greedy: same tokens); see
            `batching/constraint_modes.py`. Not with top_k/top_p when sampling, nor with speculative decoding.
        max_retries: rerun a request whose constrained document was cut short (`length_incomplete`,
            `stop_incomplete`) or whose text `validator` refuses, up to this many times, each with a new seed
            derived from `seed`; the prompt's blocks come from the prefix cache. The output records every attempt
            (`RequestOutput.attempts`).
        validator: `validator(text) -> bool`, called on each attempt that ended normally (text decoded with
            `tokenizer`, else with the constraint's vocabulary; the token ids when neither exists). Default: JSON
            Schema validation for a `JSONSchemaLogitsProcessor` request, else only incomplete documents retry.
        score_targets: scoring instead of generating (`hf_paged.api.scoring`): n token ids whose log-probabilities are
            read at the prompt's last n positions (target i is the token after position len(prompt) - n + i, so the
            first n - 1 targets are the prompt's own last n - 1 tokens); the request ends once its prompt is
            computed, with `RequestOutput.score_logprobs` / `score_greedy`, and generates nothing.
        logprobs: log-probabilities of the generated tokens (`batching/logprobs.py`): None (off), 0 (each token's
            own, `RequestOutput.logprobs`), or k in 1..20 (also the k most likely tokens at each step). Read from the
            model's raw distribution (log_softmax of the logits before processors, temperature, top-k/p and
            constraints). With `score_targets`: the k most likely tokens at each scored position
            (`RequestOutput.score_top_logprobs`).
        presence_penalty, frequency_penalty: OpenAI's penalties, each in [-2, 2]: subtracted from the logit of every
            token this request has generated (not its prompt), once (presence) or once per occurrence (frequency).
        logit_bias: `{token id: bias}`, each in [-100, 100], added to those tokens' logits at every step. Where the
            three sit among the processors and warpers: `batching/penalties.py`.

    Example:
        >>> SamplingParams(max_new_tokens=8, do_sample=True, temperature=0.7, seed=1).do_sample
        True
    """

    max_new_tokens: int = 20
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float = 1.0
    seed: int | None = None
    eos_token_id: int | list[int] | None = None
    stop_strings: list[str] | None = None
    logits_processors: list = field(default_factory=list)
    num_return_sequences: int = 1
    min_new_tokens: int = 0
    output_scores: bool = False  # keep the processed scores of every step (for generate's output_scores)
    output_logits: bool = False  # keep the raw logits of every step
    tokenizer: Any = None  # needed by stop_strings
    num_speculative_tokens: int = 0  # tokens drafted per step (0: no speculative decoding)
    draft_model: Any = None  # None: prompt lookup; else a causal LM that drafts
    prompt_lookup_max_ngram: int = 4  # longest n-gram matched by prompt lookup
    constraint_mode: str = "mask"  # "mask" | "resample" (CONSTRAINT_MODES)
    max_retries: int = 0  # reruns of a request whose document is cut short or refused by `validator`
    validator: Callable[[str | list[int]], bool] | None = None  # None: schema validation (see retry.py)
    score_targets: list[int] | None = None  # scoring: the tokens scored at the prompt's last positions
    logprobs: int | None = None  # None: off; 0: the chosen token's log-probability; k: also the top k (<= 20)
    processor_prompt_ids: list[int] | None = None  # the prompt as `logits_processors` see it (None: the prompt)
    record_timestamps: bool = False  # `RequestOutput.timestamps`: when each generated token was appended
    presence_penalty: float = 0.0  # OpenAI's, over generated tokens (penalties.py)
    frequency_penalty: float = 0.0
    logit_bias: dict[int, float] | None = None  # {token id: bias in [-100, 100]}
    min_p: float = 0.0  # (last: the fields before keep their positions)

    def __post_init__(self) -> None:
        if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise InvalidConfigError(f"SamplingParams.max_new_tokens must be an int >= 1, got {self.max_new_tokens!r}")
        if (isinstance(self.temperature, bool) or not isinstance(self.temperature, int | float)
                or not 0 <= self.temperature < float("inf")):  # (NaN too) a negative one is refused greedy or not
            raise InvalidConfigError(
                f"SamplingParams.temperature must be a finite number >= 0, got {self.temperature!r}"
            )
        if not isinstance(self.do_sample, bool):  # ("yes" sampled, None was greedy: a typo must not pick either)
            raise InvalidConfigError(f"SamplingParams.do_sample must be True or False, got {self.do_sample!r}")
        if self.do_sample and not self.temperature > 0:
            raise InvalidConfigError(f"SamplingParams.temperature must be > 0 when sampling, got {self.temperature!r}")
        if self.top_k is not None and (isinstance(self.top_k, bool) or not hasattr(self.top_k, "__index__")
                                       or operator.index(self.top_k) < 0):  # (True was top_k=1)
            raise InvalidConfigError(f"SamplingParams.top_k must be None or an int >= 0, got {self.top_k!r}")
        if self.top_k is not None:
            self.top_k = operator.index(self.top_k)  # (numpy's ints too)
        if (isinstance(self.top_p, bool) or not isinstance(self.top_p, numbers.Real)
                or not 0 <= self.top_p <= 1):  # 0 keeps the most likely token alone, as stock's TopPLogitsWarper does
            raise InvalidConfigError(f"SamplingParams.top_p must be a number in [0, 1] (1: off), got {self.top_p!r}")
        self.top_p = float(self.top_p)
        if isinstance(self.min_p, bool) or not isinstance(self.min_p, numbers.Real) or not 0 <= self.min_p <= 1:
            raise InvalidConfigError(f"SamplingParams.min_p must be a number in [0, 1] (0: off), got {self.min_p!r}")
        self.min_p = float(self.min_p)
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)
                                      or not -(2**63) <= self.seed < 2**63):
            raise InvalidConfigError(
                f"SamplingParams.seed must be None or an int in [-2**63, 2**63), got {self.seed!r}"
            )
        self._check_eos()
        if (isinstance(self.num_return_sequences, bool) or not isinstance(self.num_return_sequences, int)
                or self.num_return_sequences < 1):
            raise InvalidConfigError(
                f"SamplingParams.num_return_sequences must be >= 1, got {self.num_return_sequences!r}"
            )
        self._check_stop_strings()
        if self.logits_processors is None:
            self.logits_processors = []
        if (isinstance(self.logits_processors, str | bytes) or not isinstance(self.logits_processors, Sequence)
                or not all(callable(p) for p in self.logits_processors)):
            raise InvalidConfigError(f"SamplingParams.logits_processors must be a list of callables (transformers "
                                     f"`LogitsProcessor`s), got {self.logits_processors!r}")
        classes = [p.__name__ for p in self.logits_processors if isinstance(p, type)]
        if classes:  # (callable, so it passed; calling it built an instance per step, and its failure hung the loop)
            raise InvalidConfigError(f"SamplingParams.logits_processors holds the class {classes[0]}, not an "
                                     f"instance: pass {classes[0]}(...) (e.g. JSONSchemaLogitsProcessor(schema, "
                                     "tokenizer))")
        # (above max_new_tokens is allowed, as stock `generate` allows it: EOS stays suppressed to the end)
        if isinstance(self.min_new_tokens, bool) or not isinstance(self.min_new_tokens, int) or self.min_new_tokens < 0:
            raise InvalidConfigError(f"SamplingParams.min_new_tokens must be an int >= 0, got {self.min_new_tokens!r}")
        constrained = any(is_constraint(p) for p in self.logits_processors)
        if self.min_new_tokens and constrained:
            raise InvalidConfigError(
                "SamplingParams.min_new_tokens holds EOS back past the end of a constrained document "
                "(JSON schema, regex, choices, grammar), where nothing else is allowed: drop "
                "min_new_tokens and bound the document's own length (minLength, minItems, the pattern)"
            )
        check_logprobs(self.logprobs)
        self.presence_penalty = check_penalty("presence_penalty", self.presence_penalty)
        self.frequency_penalty = check_penalty("frequency_penalty", self.frequency_penalty)
        self.logit_bias = check_logit_bias(self.logit_bias)
        self._check_speculative()
        self._check_constraint_options()
        if self.score_targets is not None:
            self._check_scoring()

    def _check_scoring(self) -> None:
        targets = self.score_targets
        if (not isinstance(targets, list | tuple) or not targets
                or any(isinstance(t, bool) or not isinstance(t, int) or t < 0 for t in targets)):
            raise InvalidConfigError(
                f"SamplingParams.score_targets must be a non-empty list of token ids, got {targets!r}: a scored "
                "continuation needs at least one token"
            )
        others = [name for name, on in (("num_return_sequences", self.num_return_sequences > 1),
                                        ("logits_processors", bool(self.logits_processors)),
                                        ("num_speculative_tokens", self.num_speculative_tokens > 0),
                                        ("max_retries", self.max_retries > 0)) if on]
        if others:
            raise InvalidConfigError(
                f"SamplingParams.score_targets (scoring) does not combine with {', '.join(others)}: a "
                "scored request generates nothing; drop them"
            )
        self.score_targets = list(targets)

    def _check_speculative(self) -> None:
        k = self.num_speculative_tokens
        if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= MAX_SPECULATIVE_TOKENS:
            raise InvalidConfigError(
                f"SamplingParams.num_speculative_tokens must be an int in [0, {MAX_SPECULATIVE_TOKENS}], got {k!r}"
            )
        if self.draft_model is not None and k == 0:
            raise InvalidConfigError(
                "SamplingParams.draft_model needs num_speculative_tokens >= 1 (tokens drafted per step)"
            )
        n = self.prompt_lookup_max_ngram
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise InvalidConfigError(f"SamplingParams.prompt_lookup_max_ngram must be an int >= 1, got {n!r}")

    def _check_constraint_options(self) -> None:
        if self.constraint_mode not in CONSTRAINT_MODES:
            raise InvalidConfigError(
                f"SamplingParams.constraint_mode must be one of {CONSTRAINT_MODES}, got {self.constraint_mode!r}"
            )
        if self.constraint_mode == "resample":
            if self.do_sample and (self.top_k or self.top_p < 1.0 or self.min_p):
                raise InvalidConfigError(
                    f"SamplingParams.constraint_mode='resample' with top_k={self.top_k}, top_p={self.top_p}, "
                    f"min_p={self.min_p}: it draws from the unconstrained distribution first, which they truncate "
                    "before the constraint does, so the output would not follow mask mode's distribution; drop "
                    "top_k/top_p/min_p or use constraint_mode='mask'"
                )
            if self.num_speculative_tokens:
                raise InvalidConfigError(
                    "SamplingParams.constraint_mode='resample' does not combine with speculative decoding "
                    f"(num_speculative_tokens={self.num_speculative_tokens}: drafts are verified against masked "
                    "scores); use constraint_mode='mask' or num_speculative_tokens=0"
                )
        r = self.max_retries
        if isinstance(r, bool) or not isinstance(r, int) or not 0 <= r <= MAX_RETRIES:
            raise InvalidConfigError(f"SamplingParams.max_retries must be an int in [0, {MAX_RETRIES}], got {r!r}")
        if r and not self.do_sample:  # each rerun differs only by its seed
            raise InvalidConfigError("SamplingParams.max_retries reruns with new seeds, and a greedy request repeats "
                                     "the same attempt: set do_sample=True (or max_retries=0)")
        if self.validator is not None:
            if not callable(self.validator):
                raise InvalidConfigError(
                    f"SamplingParams.validator must be a callable text -> bool, got {type(self.validator).__name__}; "
                    "pass a function (or None for the default schema validation)"
                )
            if r == 0:
                raise InvalidConfigError(
                    "SamplingParams.validator has no effect with max_retries=0: set max_retries >= 1 (attempts to "
                    "rerun a request it refuses)"
                )

    def _check_stop_strings(self) -> None:
        # (checked here: a bad entry or tokenizer failed in the step's stop check, every request of the step with it)
        stops = [self.stop_strings] if isinstance(self.stop_strings, str) else self.stop_strings
        if stops is not None and (not isinstance(stops, list | tuple) or not all(isinstance(s, str) for s in stops)):
            raise InvalidConfigError(f"SamplingParams.stop_strings must be None, a string or a list of strings, "
                                     f"got {self.stop_strings!r}")
        self.stop_strings = list(stops) if stops is not None else None
        if self.stop_strings and not callable(getattr(self.tokenizer, "decode", None)):
            raise InvalidConfigError(f"SamplingParams.stop_strings needs `tokenizer=` (with a `decode`) to decode the "
                                     f"output; got tokenizer={self.tokenizer!r}: pass the model's tokenizer")

    def _check_eos(self) -> None:
        try:
            self.eos_token_ids  # noqa: B018
        except (TypeError, ValueError):
            raise InvalidConfigError(
                f"SamplingParams.eos_token_id must be None, a token id or a list of token ids (ints), "
                f"got {self.eos_token_id!r}"
            ) from None

    @property
    def eos_token_ids(self) -> frozenset[int]:
        eos = self.eos_token_id
        if eos is None:
            return frozenset()
        raw = eos.tolist() if hasattr(eos, "tolist") else eos  # (a tensor, 0-d or not)
        items = [raw] if isinstance(raw, int) else list(raw) if not isinstance(raw, str | bytes) else [raw]
        if any(isinstance(e, bool) for e in items):
            raise TypeError(f"eos_token_id {eos!r} is not a token id or a list of token ids")
        return frozenset(operator.index(e) for e in items)  # (ints and numpy's; a float or a string raises)

    def replace(self, **changes: Any) -> SamplingParams:
        return replace(self, **changes)

    @classmethod
    def from_generation_config(cls, generation_config, *, stock_processors: bool = False,
                               **overrides: Any) -> SamplingParams:
        """Read the options the engine implements from a `GenerationConfig`; raise naming unsupported ones.

        The fields stock `generate` turns into logits processors (repetition_penalty, min_p, bad_words_ids, ...,
        `processor_fields`) are not `SamplingParams` fields: a config that sets one is refused, naming it, unless
        `stock_processors=True` says the caller adds stock's processor list itself (as `generate` and
        `generate_batch` do). They would be dropped silently otherwise."""
        check_generation_config(generation_config)
        gc = generation_config
        dropped = [] if stock_processors else processor_fields(gc)
        if dropped:
            raise InvalidConfigError(
                f"SamplingParams.from_generation_config cannot carry {', '.join(dropped)}: stock builds logits "
                "processors for them, which SamplingParams has no field for; use model.generate_batch(prompts, "
                "generation_config=...) (stock's processors per request), or pass them as logits_processors= (e.g. "
                "transformers' RepetitionPenaltyLogitsProcessor, MinPLogitsWarper)"
            )
        params: dict[str, Any] = {
            "do_sample": bool(gc.do_sample),
            # greedy: stock ignores the temperature (with a warning), whatever it is; so does the engine
            "temperature": gc.temperature if gc.temperature is not None and gc.do_sample else 1.0,
            "top_k": gc.top_k,
            "top_p": gc.top_p if gc.top_p is not None else 1.0,
            "eos_token_id": gc.eos_token_id,
            "stop_strings": gc.stop_strings,
            "num_return_sequences": gc.num_return_sequences or 1,
            "min_new_tokens": gc.min_new_tokens or 0,
            "output_scores": bool(gc.output_scores),
            "output_logits": bool(getattr(gc, "output_logits", False)),
        }
        if gc.max_new_tokens is not None:
            params["max_new_tokens"] = gc.max_new_tokens
        if gc.prompt_lookup_num_tokens:
            params["num_speculative_tokens"] = min(int(gc.prompt_lookup_num_tokens), MAX_SPECULATIVE_TOKENS)
        if gc.max_matching_ngram_size:
            params["prompt_lookup_max_ngram"] = int(gc.max_matching_ngram_size)
        # not GenerationConfig fields: extra attributes (`generate_batch(..., max_retries=2)`); a `validator` is a
        # callable, which a GenerationConfig cannot hold (it serialises itself to JSON): pass `sampling_params=`
        for name in ("constraint_mode", "max_retries"):
            if getattr(gc, name, None) is not None:
                params[name] = getattr(gc, name)
        names = {f.name for f in fields(cls)}
        params.update({k: v for k, v in overrides.items() if k in names})
        return cls(**params)


# GenerationConfig fields stock generate turns into logits processors (transformers 5.x) and their neutral
# values; the warpers among them act only when sampling. temperature / top_k / top_p / min_new_tokens are SamplingParams'.
_PROCESSOR_FIELDS = {"repetition_penalty": (1.0,), "no_repeat_ngram_size": (0,), "bad_words_ids": (), "min_length": (0,),
                     "sequence_bias": (), "suppress_tokens": (), "begin_suppress_tokens": (), "forced_bos_token_id": (),
                     "forced_eos_token_id": (), "exponential_decay_length_penalty": (), "renormalize_logits": (False,),
                     "remove_invalid_values": (False,), "watermarking_config": ()}
_WARPER_FIELDS = {"min_p": (0.0,), "typical_p": (1.0,), "epsilon_cutoff": (0.0,), "eta_cutoff": (0.0,), "top_h": ()}


def processor_fields(generation_config) -> list[str]:
    """The fields of `generation_config` set to a value stock turns into a logits processor (none of them is a
    `SamplingParams` field)."""
    def set_(name: str, neutral: tuple) -> bool:
        value = getattr(generation_config, name, None)
        return value is not None and value not in neutral and not (isinstance(value, list | dict) and not value)

    found = [name for name, neutral in _PROCESSOR_FIELDS.items() if set_(name, neutral)]
    if generation_config.do_sample:
        found += [name for name, neutral in _WARPER_FIELDS.items() if set_(name, neutral)]
    return found


def unsupported_modes(generation_config) -> list[str]:
    """The decoding modes of a `GenerationConfig` the engine does not run, by name (empty: it runs them all). The one
    list: `generate` falls back to stock for them, `generate_batch` and the server refuse them."""
    gc, modes = generation_config, []
    if (gc.num_beams or 1) > 1:
        modes.append(f"beam search (num_beams={gc.num_beams})")
    if (getattr(gc, "num_beam_groups", 1) or 1) > 1:
        modes.append("group beam search (num_beam_groups)")
    if getattr(gc, "penalty_alpha", None):
        modes.append("contrastive search (penalty_alpha)")
    if getattr(gc, "assistant_early_exit", None):
        modes.append("self-speculative decoding (assistant_early_exit)")
    if getattr(gc, "guidance_scale", None) not in (None, 1, 1.0):
        modes.append("classifier-free guidance (guidance_scale)")
    if getattr(gc, "dola_layers", None) is not None:
        modes.append("DoLa decoding (dola_layers)")
    if getattr(gc, "encoder_repetition_penalty", None) not in (None, 1, 1.0) \
            or getattr(gc, "encoder_no_repeat_ngram_size", None):  # stock reads the batch's padded prompts
        modes.append("encoder_repetition_penalty / encoder_no_repeat_ngram_size")
    if type(getattr(gc, "watermarking_config", None)).__name__ == "SynthIDTextWatermarkingConfig":
        # (its processor keeps one state for the batch, a context per row advanced once a call: called once per row
        # and step, as the engine calls processors, it mixes the rows and its watermark fails detection)
        modes.append("SynthID text watermarking (watermarking_config)")
    if getattr(gc, "cache_implementation", None) == "quantized":  # lossy: stock's answers are its quantized cache's
        modes.append("stock's quantized KV cache (cache_implementation='quantized'; hf_paged's own quantized blocks: "
                     "PagedConfig(kv_cache_dtype='int8'))")
    return modes


def check_generation_config(generation_config) -> None:
    """Raise `UnsupportedGenerationError` naming every option the engine cannot honour."""
    from hf_paged.errors import UnsupportedGenerationError

    unsupported = unsupported_modes(generation_config)
    if unsupported:
        raise UnsupportedGenerationError(
            f"the paged engine does not support {', '.join(unsupported)}; use the unwrapped model "
            "(hf_paged.unwrap) or stock generate for these modes"
        )


def as_list(ids: Sequence[int] | int | None) -> list[int]:
    if ids is None:
        return []
    if isinstance(ids, int):
        return [ids]
    return [int(i) for i in (ids.tolist() if hasattr(ids, "tolist") else ids)]
