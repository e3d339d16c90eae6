"""Our logits processors, listed once: what ``LOGITS_PROCESSORS``, the plugin's entry-point
classes (``constrained.plugin``) and the ``vllm.logits_processors`` entry points of
``pyproject.toml`` are derived from (``tests/test_plugin.py`` checks ``pyproject.toml``
agrees).

Names only, no imports: ``import constrained`` stays light, and the table imports nothing
that imports it.

The order is the application order (vLLM applies custom processors in list order): bias and
penalties, then the grammar mask, then the bans and truncation samplers in llama.cpp's order
(they see only tokens the grammar allows, and never remove the last of them), then min-p
(after temperature on V1).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Processor:
    """One processor: its class, its entry point's name, and whether it reads the values of
    a request's output tokens (vLLM fills their ``-1`` placeholders under Model Runner V1
    with async scheduling only for the flag's processors: ``engine_processors.applied_options``)."""

    module: str
    name: str
    entry_point: str
    reads_output_tokens: bool

    @property
    def path(self) -> str:
        """``"pkg.mod:Class"``, as ``--logits-processors`` takes it."""
        return f"{self.module}:{self.name}"


PROCESSORS: tuple[Processor, ...] = (
    Processor("constrained.processors.logit_bias", "LogitBiasProcessor",
              "constrained_1_logit_bias", reads_output_tokens=False),
    Processor("constrained.processors.penalties", "PenaltiesProcessor",
              "constrained_2_penalties", reads_output_tokens=True),
    Processor("constrained.processors.dry", "DryProcessor",
              "constrained_3_dry", reads_output_tokens=True),
    Processor("constrained.processors.grammar_mask", "GrammarMaskProcessor",
              "constrained_4_grammar", reads_output_tokens=True),
    Processor("constrained.processors.no_repeat_ngram", "NoRepeatNGramProcessor",
              "constrained_5_no_repeat_ngram", reads_output_tokens=True),
    Processor("constrained.processors.top_n_sigma", "TopNSigmaProcessor",
              "constrained_6_top_n_sigma", reads_output_tokens=False),
    Processor("constrained.processors.typical_p", "TypicalPProcessor",
              "constrained_7_typical_p", reads_output_tokens=False),
    Processor("constrained.processors.xtc", "XtcProcessor",
              "constrained_8_xtc", reads_output_tokens=False),
    Processor("constrained.processors.min_p", "MinPProcessor",
              "constrained_9_min_p", reads_output_tokens=False),
)  # fmt: skip

LOGITS_PROCESSORS: list[str] = [p.path for p in PROCESSORS]
# The module of the entry-point classes (one per processor, named as it: ``plugin.py``).
PLUGIN_MODULE = "constrained.plugin"


def entry_points() -> dict[str, str]:
    """The ``vllm.logits_processors`` entry points ``pyproject.toml`` lists: name -> value."""
    return {p.entry_point: f"{PLUGIN_MODULE}:{p.name}" for p in PROCESSORS}
