"""Integrations with the tools evaluation runs in.

    trainer.py  PagedGenerationCallback  generation metrics at every Trainer evaluation (exact_match, json_validity)
    lm_eval.py  PagedLM                  lm-evaluation-harness's model `hf-paged` (the `eval` extra): every request
                                         of a task on the engine, log-likelihoods through `hf_paged.api.scoring`

Names load on first use: importing this package imports neither Trainer nor lm-eval.
"""

from hf_paged.lazy import lazy_attributes

__getattr__ = lazy_attributes(__name__, {
    "PagedGenerationCallback": "hf_paged.integrations.trainer",
    "exact_match": "hf_paged.integrations.trainer",
    "json_validity": "hf_paged.integrations.trainer",
    "PagedLM": "hf_paged.integrations.lm_eval",
})

__all__ = ["PagedGenerationCallback", "PagedLM", "exact_match", "json_validity"]
