"""`hf-paged serve`'s engine flags reach `PagedConfig` by name, and a bad combination is one typed error."""

import argparse

import pytest

from hf_paged.config import PagedConfig
from hf_paged.serving.server import add_serve_arguments, paged_overrides


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    return parser.parse_args(list(argv))


def test_the_step_time_ratio_flag_reaches_the_config():
    overrides = paged_overrides(_args("--max-prefill-tokens-per-step", "16", "--max-prefill-step-time-ratio", "1.3",
                                      "--no-prefix-caching"))
    assert overrides == {"max_prefill_tokens_per_step": 16, "max_prefill_step_time_ratio": 1.3,
                         "enable_prefix_caching": False}
    assert PagedConfig(**overrides).max_prefill_step_time_ratio == 1.3
    with pytest.raises(ValueError, match="max_prefill_step_time_ratio must be a number > 1"):
        PagedConfig(**paged_overrides(_args("--max-prefill-tokens-per-step", "16",
                                            "--max-prefill-step-time-ratio", "0.5")))
    assert paged_overrides(_args()) == {}  # unset flags keep the config's defaults
