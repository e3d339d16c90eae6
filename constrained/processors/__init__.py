"""vLLM logits processors. Each class works under Model Runner V1 and V2 (see ``base``)."""

from constrained.processors.grammar_mask import GrammarMaskProcessor
from constrained.processors.logit_bias import LogitBiasProcessor
from constrained.processors.min_p import MinPProcessor
from constrained.processors.penalties import PenaltiesProcessor

__all__ = ["GrammarMaskProcessor", "LogitBiasProcessor", "MinPProcessor", "PenaltiesProcessor"]
