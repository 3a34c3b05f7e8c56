"""What a request that leaves a sampling field out gets: the checkpoint's recommended values, or OpenAI's defaults.

Checkpoints ship their authors' sampling settings in `generation_config.json` (Llama-3.x: temperature 0.6, top_p
0.9; Qwen2.5: temperature 0.7, top_p 0.8, top_k 20, repetition_penalty 1.05). `hf-paged serve` applies them to the
fields a request omits, as vLLM does (`--generation-config auto`, the default); `--generation-config vllm` ignores
them (OpenAI's defaults: temperature 1, top_p 1, no top_k, no penalty); `--generation-config DIR` reads another
`generation_config.json`. A field the request sends always wins (`temperature: 0` is greedy).

Read: `temperature`, `top_p`, `top_k`, `min_p`, `repetition_penalty`, and `max_new_tokens` (the default
`max_tokens`), as vLLM reads them. Not read: `do_sample` (an OpenAI request that omits `temperature` samples,
whatever the config says), `max_length` (it counts the prompt: GPT-2-era configs carry `max_length: 20`,
transformers' old truncation, which would cut every answer). The EOS ids are always the config's plus the
tokenizer's.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

__all__ = ["GENERATION_CONFIG_MODES", "RequestDefaults", "check_mode", "request_defaults"]

GENERATION_CONFIG_MODES = ("auto", "vllm")  # or a directory holding a generation_config.json

logger = logging.getLogger("hf_paged.serving")


@dataclass(frozen=True, slots=True)
class RequestDefaults:
    """Values for the sampling fields a request omits (None: OpenAI's default for that field)."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    max_tokens: int | None = None  # the config's max_new_tokens (chat: capped by the room the prompt leaves)

    @classmethod
    def from_generation_config(cls, config: Any) -> RequestDefaults:
        """The values a `GenerationConfig` sets (transformers 5 leaves unset fields None); neutral ones dropped."""
        def value(name: str, neutral: Any) -> Any:
            found = getattr(config, name, None)
            return None if found is None or found == neutral else found

        top_k = value("top_k", 0)
        return cls(temperature=value("temperature", None), top_p=value("top_p", 1.0),
                   top_k=top_k if top_k is None or top_k > 0 else None, min_p=value("min_p", 0.0),
                   repetition_penalty=value("repetition_penalty", 1.0), max_tokens=value("max_new_tokens", None))

    def as_dict(self) -> dict[str, Any]:
        """The fields set, for the start-up log and `/v1/models`."""
        return {k: v for k, v in asdict(self).items() if v is not None}


def check_mode(mode: str) -> None:
    """`--generation-config MODE` is auto, vllm or a directory holding a generation_config.json (ValueError else)."""
    if mode not in GENERATION_CONFIG_MODES and not (Path(mode).expanduser() / "generation_config.json").is_file():
        raise ValueError(f"--generation-config {mode!r}: give auto (the model's), vllm (OpenAI's defaults), or a "
                         "directory holding a generation_config.json")


def request_defaults(model: Any, mode: str = "auto") -> RequestDefaults:
    """The request defaults `--generation-config MODE` gives for `model`: "auto" reads `model.generation_config`,
    "vllm" none, anything else is a directory with a `generation_config.json` (ValueError when it has none)."""
    if mode == "vllm":
        return RequestDefaults()
    if mode == "auto":
        config = getattr(model, "generation_config", None)
    else:
        from transformers import GenerationConfig

        check_mode(mode)
        config = GenerationConfig.from_pretrained(str(Path(mode).expanduser()))
    defaults = RequestDefaults.from_generation_config(config) if config is not None else RequestDefaults()
    if defaults.as_dict():
        logger.info("requests that omit them get the checkpoint's generation_config values %s (--generation-config "
                    "vllm: OpenAI's defaults instead)", defaults.as_dict())
    return defaults
