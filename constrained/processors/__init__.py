"""vLLM logits processors. Each class works under Model Runner V1 and V2 (see ``base``)."""

from constrained.processors.dry import DryProcessor
from constrained.processors.grammar_mask import GrammarMaskProcessor
from constrained.processors.logit_bias import LogitBiasProcessor
from constrained.processors.min_p import MinPProcessor
from constrained.processors.no_repeat_ngram import NoRepeatNGramProcessor
from constrained.processors.penalties import PenaltiesProcessor
from constrained.processors.top_n_sigma import TopNSigmaProcessor
from constrained.processors.typical_p import TypicalPProcessor
from constrained.processors.xtc import XtcProcessor

__all__ = [
    "DryProcessor",
    "GrammarMaskProcessor",
    "LogitBiasProcessor",
    "MinPProcessor",
    "NoRepeatNGramProcessor",
    "PenaltiesProcessor",
    "TopNSigmaProcessor",
    "TypicalPProcessor",
    "XtcProcessor",
]
