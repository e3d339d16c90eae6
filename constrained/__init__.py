"""constrained: per-request logits processors for vLLM, as a vLLM plugin.

Installed, the package registers its processors through vLLM's ``vllm.logits_processors``
entry points: every engine loads them, no flag needed; pass options per request::

    llm = LLM(model=path)
    llm.generate(prompts, SamplingParams(extra_args={"min_p": 0.1, "logit_bias": {11: 5.0}}))

``LOGITS_PROCESSORS`` still works with ``LLM(logits_processors=...)`` / ``--logits-processors``
(the entry-point copies then stay inert: ``constrained.plugin``).
"""

from constrained.options import OptionError, Options
from constrained.processor_table import LOGITS_PROCESSORS

__version__ = "0.2.0"

__all__ = ["LOGITS_PROCESSORS", "OptionError", "Options", "__version__"]
