"""Our logits processors, listed once: what ``LOGITS_PROCESSORS``, the plugin's entry-point
classes (``constrained.plugin``) and the ``vllm.logits_processors`` entry points of
``pyproject.toml`` are derived from (``tests/test_plugin.py`` checks ``pyproject.toml``
agrees).

Names only, no imports: ``import constrained`` stays light, and the table imports nothing
that imports it.

The order is the application order (vLLM applies custom processors in list order): the
grammar mask first, then bias and penalties, then the bans and truncation samplers in
llama.cpp's order, then min-p (after temperature on V1). Everything after the mask sees only
the tokens the grammar allows: a bias or penalty is a finite push and a masked logit is -inf,
so they commute with the mask (the same logits as applying them before it), and the
penalties can read which rows the grammar leaves open (``content_rows.py``); the bans and
truncation samplers never remove the last allowed token.
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
    Processor("constrained.processors.grammar_mask", "GrammarMaskProcessor",
              "constrained_1_grammar", reads_output_tokens=True),
    Processor("constrained.processors.logit_bias", "LogitBiasProcessor",
              "constrained_2_logit_bias", reads_output_tokens=False),
    Processor("constrained.processors.penalties", "PenaltiesProcessor",
              "constrained_3_penalties", reads_output_tokens=True),
    Processor("constrained.processors.dry", "DryProcessor",
              "constrained_4_dry", reads_output_tokens=True),
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
