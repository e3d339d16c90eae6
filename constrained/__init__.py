"""constrained: per-request logits processors for vLLM, as a vLLM plugin.

Installed, the package registers its processors through vLLM's ``vllm.logits_processors``
entry points: every engine loads them, no flag needed; pass options per request::

    llm = LLM(model=path)
    llm.generate(prompts, SamplingParams(extra_args={"min_p": 0.1, "logit_bias": {11: 5.0}}))

``LOGITS_PROCESSORS`` still works with ``LLM(logits_processors=...)`` / ``--logits-processors``
(the entry-point copies then stay inert: ``constrained.plugin``).
"""

from constrained.options import OptionError, Options

__version__ = "0.2.0"

# In application order (vLLM applies custom processors in list order): bias and penalties,
# then the grammar mask, then the bans and truncation samplers in llama.cpp's order (they see
# only tokens the grammar allows, and never remove the last of them), then min-p (after
# temperature on V1).
LOGITS_PROCESSORS: list[str] = [
    "constrained.processors.logit_bias:LogitBiasProcessor",
    "constrained.processors.penalties:PenaltiesProcessor",
    "constrained.processors.dry:DryProcessor",
    "constrained.processors.grammar_mask:GrammarMaskProcessor",
    "constrained.processors.no_repeat_ngram:NoRepeatNGramProcessor",
    "constrained.processors.top_n_sigma:TopNSigmaProcessor",
    "constrained.processors.typical_p:TypicalPProcessor",
    "constrained.processors.xtc:XtcProcessor",
    "constrained.processors.min_p:MinPProcessor",
]

__all__ = ["LOGITS_PROCESSORS", "OptionError", "Options", "__version__"]
