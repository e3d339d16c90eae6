"""The per-request options of the package, one pydantic model for all of them.

The same model parses offline ``SamplingParams.extra_args`` and the server's ``vllm_xargs``
(which cannot carry nested objects, so mapping-valued options also arrive as JSON strings).
It is a pure schema: each value's type and range, and which options go together. Checks
that need the request or the engine (unknown keys, vLLM's own twins, the logits width,
registered processors, compiling a constraint) are in ``constrained.admission``.

Example::

    from constrained import Options
    params = SamplingParams(extra_args=Options(min_p=0.1, logit_bias={11: 5.0}).to_extra_args())
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from constrained.grammars.registry import AUTO, BACKEND_NAMES, get_backend

LOGIT_BIAS_LIMIT = 100.0
PENALTY_LIMIT = 2.0  # OpenAI's range for frequency and presence penalties
MAX_PENALTY_WINDOW = 32_767
PenaltyScope = Literal["default", "output", "prompt_and_output"]
GrammarBackend = Literal[BACKEND_NAMES]  # type: ignore[valid-type]  # from the registry
Whitespace = Literal["compact", "flexible"]
MAX_WHITESPACE_LIMIT = 16
GRAMMAR_FIELDS = ("json_schema", "regex", "grammar", "choice", "json_object", "structural_tag")
# The spec kind each constraint field compiles as (``choice`` as a regex of its strings).
CONSTRAINT_KINDS = {"json_schema": "json_schema", "json_object": "json_schema",
                    "regex": "regex", "grammar": "grammar", "choice": "regex",
                    "structural_tag": "structural_tag"}  # fmt: skip
# Kinds whose JSON the whitespace / disable_additional_properties options shape.
JSON_KINDS = frozenset({"json_schema", "structural_tag"})
JSON_OBJECT_SCHEMA = '{"type": "object"}'
MAX_CHOICES = 1024
# llama.cpp's default DRY sequence breakers.
DRY_DEFAULT_BREAKERS = ("\n", ":", '"', "*")
MAX_DRY_BREAKERS = 32
XTC_MAX_THRESHOLD = 0.5  # above it at most one token can qualify, so XTC would do nothing
MAX_NGRAM_SIZE = 64
# vLLM's DeepSeek-OCR ``NGramPerReqLogitsProcessor`` names for our no-repeat-ngram options:
# accepted, so a request written for that processor works unchanged.
VLLM_OCR_ALIASES = {
    "ngram_size": "no_repeat_ngram_size",
    "window_size": "ngram_window",
    "whitelist_token_ids": "ngram_whitelist",
}
VLLM_OCR_DEFAULT_WINDOW = 100  # that processor's window_size when a request omits it
# The options whose twins in vLLM's SamplingParams are floats: an integer given is kept as one.
AS_FLOAT = frozenset({"min_p", "repetition_penalty", "frequency_penalty", "presence_penalty"})
# The numeric options' ranges: (low, high or None, low excluded, why), one rule each.
RANGES: dict[str, tuple[float, float | None, bool, str]] = {
    "min_p": (0, 1, False, ""),
    # (float32 holds it and 1 / it: 1e39 would be inf there, 1e-50 zero, and 0 * inf NaN)
    "repetition_penalty": (1e-30, 1e30, False, " (1 = off)"),
    "frequency_penalty": (-PENALTY_LIMIT, PENALTY_LIMIT, False, ""),
    "presence_penalty": (-PENALTY_LIMIT, PENALTY_LIMIT, False, ""),
    "penalty_last_n": (0, MAX_PENALTY_WINDOW, False, " (0 = no window)"),
    "max_whitespace": (0, MAX_WHITESPACE_LIMIT, False, ""),
    "max_reasoning_tokens": (0, None, False, ""),
    "dry_multiplier": (0, None, False, " (0 = off)"),
    "dry_base": (1, None, False, ""),
    "dry_allowed_length": (1, MAX_PENALTY_WINDOW, False, ""),
    "xtc_probability": (0, 1, False, ""),
    "xtc_threshold": (
        0,
        XTC_MAX_THRESHOLD,
        False,
        f" (above {XTC_MAX_THRESHOLD} at most one token can reach it, so XTC would never "
        "remove anything)",
    ),
    "top_n_sigma": (0, None, True, " (omit it to turn top-n-sigma off)"),
    "typical_p": (0, 1, True, " (1 = off)"),
    "no_repeat_ngram_size": (1, MAX_NGRAM_SIZE, False, ""),
    "ngram_window": (1, MAX_PENALTY_WINDOW, False, ""),
}
# An option that does nothing without another one: refused alone, never silently ignored.
REQUIRES = {
    "dry_base": "dry_multiplier",
    "dry_allowed_length": "dry_multiplier",
    "dry_penalty_last_n": "dry_multiplier",
    "dry_sequence_breakers": "dry_multiplier",
    "xtc_threshold": "xtc_probability",
    "ngram_window": "no_repeat_ngram_size",
    "ngram_whitelist": "no_repeat_ngram_size",
    "max_reasoning_tokens": "reasoning_end",
}
MAX_REASONING_MARKER_CHARS = 64
JSON_ONLY_FIELDS = ("whitespace", "max_whitespace", "disable_additional_properties")
Number = Annotated[StrictFloat | StrictInt, Field()]


class OptionError(ValueError):
    """A per-request option is invalid. ``field`` names the option at fault."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        self.reason = message
        super().__init__(f"constrained: invalid option '{field}': {message}")


def _finite(value: float) -> float:
    if not math.isfinite(value):
        raise ValueError(f"must be a finite number, got {value}")
    return float(value)


class OptionQueries:
    """What a parsed request asks for, derived from its fields (``Options`` inherits these;
    kept apart from the fields and their checks)."""

    def constraint_field(self) -> str | None:
        """The constraint option the request gave (``json_schema``, ``choice`` ...), if any."""
        for name in GRAMMAR_FIELDS:
            value = getattr(self, name)
            if value is not None and value is not False:
                return name
        return None

    def constraint(self) -> tuple[str, str] | None:
        """``(kind, source)`` the request's constraint compiles as, if any: ``choice`` is a
        regex of its strings, ``json_object`` the schema ``{"type": "object"}``."""
        name = self.constraint_field()
        if name is None:
            return None
        if name == "choice":
            from constrained.grammars.spec import choice_regex

            return "regex", choice_regex(self.choice or [])
        if name == "json_object":
            return "json_schema", JSON_OBJECT_SCHEMA
        return name, getattr(self, name)

    def is_active(self) -> bool:
        """True when some option would change the logits."""
        return (
            bool(self.logit_bias)
            or bool(self.min_p)
            or self.has_penalties()
            or self.constraint() is not None
            or self.has_dry()
            or bool(self.xtc_probability)
            or self.top_n_sigma is not None
            or (self.typical_p is not None and self.typical_p < 1.0)
            or self.no_repeat_ngram_size is not None
        )

    def spares_structure(self) -> bool:
        """Whether the repetition family (penalties, DRY, no-repeat-ngram) counts and
        penalizes only content (``penalize_structure``)."""
        repeats = self.has_penalties() or self.has_dry() or self.no_repeat_ngram_size is not None
        return self.constraint() is not None and not self.penalize_structure and repeats

    def has_dry(self) -> bool:
        return bool(self.dry_multiplier) and self.dry_penalty_last_n != 0

    def has_penalties(self) -> bool:
        return (
            (self.repetition_penalty is not None and self.repetition_penalty != 1.0)
            or bool(self.frequency_penalty)
            or bool(self.presence_penalty)
        )


class Options(OptionQueries, BaseModel):
    """Every per-request option of ``constrained``; all default to off.

    Attributes:
        logit_bias: token id -> additive bias in [-100, 100], added to the raw logits
            (``logits[id] += bias``), at the point where vLLM adds its own ``logit_bias``.
        min_p: in [0, 1]; after temperature, drop tokens with ``p < min_p * p_max``.
        repetition_penalty: > 0 (1 = off); for tokens seen, positive logits are divided by it
            and non-positive ones multiplied.
        frequency_penalty: in [-2, 2]; ``logit -= frequency_penalty * count``.
        presence_penalty: in [-2, 2]; ``logit -= presence_penalty * (count > 0)``.
        penalty_last_n: 0 (default) counts the whole sequence; n > 0 counts only the last n
            tokens of prompt + output, as llama.cpp's ``repeat_last_n``.
        penalty_scope: which tokens the penalties count. ``default`` is vLLM's: repetition
            over prompt and output, frequency and presence over output. ``output``: all three
            over output only. ``prompt_and_output``: all three over prompt and output.
        penalize_structure: with a constraint. ``False`` (default): the penalties count
            and penalize only content (``grammars/content.py``): tokens the model chose on
            an open row (inside a JSON string value, thinking, wide free text); rows where
            the grammar decides (keys, punctuation, enum values, forced tokens) keep the
            logits they would have with no penalty. ``True``: every output token, as
            without a constraint.
        json_schema: the output must be JSON valid against this schema (a JSON string, a
            dict, or offline a pydantic model class).
        regex: the output must match this regular expression in full.
        grammar: the output must match this grammar (GBNF ``root ::= ...``; Lark with
            llguidance). At most one constraint per request: ``json_schema``, ``regex``,
            ``grammar``, ``choice``, ``json_object`` or ``structural_tag``.
        choice: a list of distinct, non-empty strings: the output is exactly one of them
            (as vLLM's ``choice``).
        json_object: ``True``: the output is any JSON object (as OpenAI's
            ``response_format={"type": "json_object"}``).
        structural_tag: vLLM's ``structural_tag`` (JSON text, or offline a dict): free text
            until a trigger, then a structure's ``begin``, JSON valid against its ``schema``
            and its ``end`` (``{"type": "structural_tag", "triggers": [...], "structures":
            [{"begin", "schema", "end"}]}``), or xgrammar's format (``{"type":
            "structural_tag", "format": {...}}``), as vLLM's tool calls use. Every schema
            inside is held to the same refusals as ``json_schema``. At most one of
            ``json_schema``, ``regex``, ``grammar``, ``choice``, ``json_object`` and
            ``structural_tag``.
        grammar_backend: ``auto`` (default: the first of llguidance, xgrammar, outlines that
            enforces every keyword used), or one of them by name.
        whitespace: JSON only. ``compact`` (default): no whitespace between tokens.
            ``flexible``: up to ``max_whitespace`` spaces, tabs or newlines after each ``,``
            and ``:``.
        max_whitespace: JSON with ``whitespace="flexible"`` only, in [0, 16], default 2.
        dry_multiplier: >= 0 (0 = off); DRY ("don't repeat yourself", as llama.cpp): a token
            that would extend a repeat of ``n >= dry_allowed_length`` tokens gets
            ``logit -= dry_multiplier * dry_base ** (n - dry_allowed_length)``.
        dry_base: >= 1, default 1.75. dry_allowed_length: >= 1, default 2.
        dry_penalty_last_n: -1 (default) the whole sequence, 0 off, n > 0 the last n tokens.
        dry_sequence_breakers: strings that end a repeat, default llama.cpp's
            ``["\\n", ":", "\"", "*"]``.
        xtc_probability: in [0, 1]; XTC ("exclude top choices"): with this probability per
            step, every token with ``p >= xtc_threshold`` except the least likely of them is
            removed (when at least two qualify).
        xtc_threshold: in [0, 0.5], default 0.1.
        top_n_sigma: > 0; keep tokens with ``logit >= max - top_n_sigma * std`` (std of the
            finite logits).
        typical_p: in (0, 1]; locally typical sampling: keep the tokens closest to the
            distribution's entropy until their mass exceeds ``typical_p``.
        no_repeat_ngram_size: >= 1; a token that would complete an n-gram already in the
            window is banned. ngram_window: >= 1, only the last tokens (default: all).
        ngram_whitelist: token ids never banned.
        disable_additional_properties: JSON only. ``True``: objects whose schema says nothing
            about extra keys get none (as vLLM's option of that name and xgrammar's strict
            mode); outputs still validate. Default ``False``: JSON Schema's meaning (extra
            keys allowed).
        reasoning_end: with a constraint: the text that ends the model's thinking (e.g.
            ``"</think>"``; one added token is matched as that token, as vLLM's reasoning
            parsers do, other text over the output tokens' bytes). Until the output
            contains it, decoding is free (our other options still apply; end-of-sequence,
            the request's stop tokens and tokens that would carry text past the marker are
            not allowed, so the answer always comes, all of it checked); from the token
            after it, the constraint applies. A prompt that
            already ends with it (thinking disabled by the chat template) is constrained
            from the first token.
        max_reasoning_tokens: >= 0, needs ``reasoning_end``: after this many output tokens
            without the marker, the marker is forced, then the constraint applies.
        close_at_max_tokens: with a constraint (any of the above). ``True``
            (default): the output finishes, complete and valid, within ``max_tokens``: near
            the budget only tokens that still leave a complete output in time are allowed,
            and a ``max_tokens`` too small for any complete output is refused.
            ``False``: the output is cut at ``max_tokens`` (``finish_reason="length"``).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    logit_bias: dict[int, Number] | None = None
    min_p: Number | None = None
    repetition_penalty: Number | None = None
    frequency_penalty: Number | None = None
    presence_penalty: Number | None = None
    penalty_last_n: StrictInt | None = None
    penalty_scope: PenaltyScope | None = None
    penalize_structure: StrictBool | None = None
    json_schema: str | None = None
    regex: str | None = None
    grammar: str | None = None
    choice: list[str] | None = None
    json_object: StrictBool | None = None
    structural_tag: str | None = None
    grammar_backend: GrammarBackend | None = None
    whitespace: Whitespace | None = None
    max_whitespace: StrictInt | None = None
    disable_additional_properties: StrictBool | None = None
    close_at_max_tokens: StrictBool | None = None
    reasoning_end: str | None = None
    max_reasoning_tokens: StrictInt | None = None
    dry_multiplier: Number | None = None
    dry_base: Number | None = None
    dry_allowed_length: StrictInt | None = None
    dry_penalty_last_n: StrictInt | None = None
    dry_sequence_breakers: list[str] | None = None
    xtc_probability: Number | None = None
    xtc_threshold: Number | None = None
    top_n_sigma: Number | None = None
    typical_p: Number | None = None
    no_repeat_ngram_size: StrictInt | None = None
    ngram_window: StrictInt | None = None
    ngram_whitelist: list[StrictInt] | None = None

    @field_validator("json_schema", mode="before")
    @classmethod
    def _parse_schema(cls, value: Any, info: ValidationInfo) -> Any:
        from constrained.schema.user_input import schema_text

        # What admission checked the engine does not check again (``from_extra_args``).
        return schema_text(value, check=not _admitted(info))

    @field_validator("structural_tag", mode="before")
    @classmethod
    def _parse_structural_tag(cls, value: Any, info: ValidationInfo) -> Any:
        from constrained.grammars.structural_tag import checked_structural_tag

        if value is None:
            return None
        return checked_structural_tag(value, check=not _admitted(info))

    @field_validator("regex", "grammar")
    @classmethod
    def _check_text(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("must not be empty")
        return value

    @field_validator(
        "json_object",
        "disable_additional_properties",
        "close_at_max_tokens",
        "penalize_structure",
        mode="before",
    )
    @classmethod
    def _bool_from_xargs(cls, value: Any) -> Any:
        # vLLM's request model types vllm_xargs values as str | int | float | list, so a JSON
        # true arrives as 1 and false as 0: take exactly those two as the boolean they were.
        if type(value) is int and value in (0, 1):
            return bool(value)
        return value

    @field_validator("choice", mode="before")
    @classmethod
    def _parse_choice(cls, value: Any) -> Any:
        return parse_choice(value)

    @field_validator("reasoning_end")
    @classmethod
    def _check_marker(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("must not be empty")
        if value is not None and len(value) > MAX_REASONING_MARKER_CHARS:
            raise ValueError(f"at most {MAX_REASONING_MARKER_CHARS} characters, got {len(value)}")
        return value

    @field_validator("logit_bias", mode="before")
    @classmethod
    def _parse_logit_bias(cls, value: Any) -> Any:
        return parse_logit_bias(value)

    @field_validator(*RANGES)
    @classmethod
    def _check_sampler_range(cls, value: float | None, info: ValidationInfo) -> float | None:
        """One range rule per numeric option (``RANGES``)."""
        if value is None:
            return None
        low, high, low_open, why = RANGES[info.field_name]
        if isinstance(value, float) or info.field_name in AS_FLOAT:
            value = _finite(value)
        below = value <= low if low_open else value < low
        if below or (high is not None and value > high):
            interval = f"{'(' if low_open else '['}{low:g}, {high:g}]" if high is not None else ""
            shown = f"in {interval}" if interval else f"{'>' if low_open else '>='} {low:g}"
            raise ValueError(f"must be {shown}{why}, got {value}")
        return value

    @field_validator("dry_penalty_last_n")
    @classmethod
    def _check_dry_window(cls, value: int | None) -> int | None:
        if value is not None and value < -1:
            raise ValueError(f"must be -1 (whole sequence), 0 (off) or a window > 0, got {value}")
        return value

    @field_validator("dry_sequence_breakers")
    @classmethod
    def _check_dry_breakers(cls, value: list[str] | None) -> list[str] | None:
        if value is None:
            return None
        if len(value) > MAX_DRY_BREAKERS:
            raise ValueError(f"at most {MAX_DRY_BREAKERS} breakers, got {len(value)}")
        for breaker in value:
            if len(breaker.encode()) != 1:
                raise ValueError(
                    f"each breaker must be one ASCII character (as llama.cpp's defaults), got "
                    f"{breaker!r}: longer breakers span several tokens, not supported yet"
                )
        return value

    # ---- construction ------------------------------------------------------------------

    @classmethod
    def from_extra_args(
        cls,
        extra_args: Mapping[str, Any] | None,
        *,
        logits_width: int | None = None,
        admitted: bool = False,
    ) -> Options | None:
        """Parse our keys out of ``extra_args``; ``None`` when the request uses none of them.

        Other keys are ignored here; admission (``constrained.admission``) refuses unknown ones.
        ``admitted``: the engine's parse of a request admission passed, which skips the
        schema's checks that only refuse (``user_input.schema_text``'s meta-schema, ``$ref``
        loops, no instance: 10 ms a new schema, on the engine's step) and gives the same
        options.

        Raises:
            OptionError: an option is invalid.
        """
        if not extra_args:
            return None
        ours = {k: v for k, v in extra_args.items() if k in cls.model_fields}
        aliased = _resolve_aliases(extra_args, ours)
        if not ours:
            return None
        try:
            try:
                options = cls.model_validate(ours, context={"admitted": admitted})
            except ValidationError as exc:
                raise _option_error(exc) from None
            _check_grammar_options(options)
            _check_requirements(options)
            if logits_width is not None:
                _check_token_ids(options, logits_width)
        except OptionError as error:
            if error.field in aliased:  # name the key the request used
                raise OptionError(aliased[error.field], error.reason) from None
            raise
        return options if options.is_active() else None

    def to_extra_args(self) -> dict[str, Any]:
        """The dict for ``SamplingParams(extra_args=...)`` (options left unset are omitted)."""
        return self.model_dump(exclude_none=True)

    def to_vllm_xargs(self) -> dict[str, Any]:
        """The dict for the server's ``vllm_xargs``: mappings become JSON strings."""
        out = self.to_extra_args()
        if "logit_bias" in out:
            out["logit_bias"] = json.dumps({str(k): v for k, v in out["logit_bias"].items()})
        return out


def parse_choice(value: Any) -> Any:
    if isinstance(value, str):  # vllm_xargs may carry the list as JSON text
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"not valid JSON ({exc.msg} at char {exc.pos})") from None
    if not isinstance(value, list) or not all(isinstance(c, str) for c in value):
        raise ValueError(f"must be a list of strings, got {value!r:.80}")
    if not value:
        raise ValueError("must not be empty")
    if len(value) > MAX_CHOICES:
        raise ValueError(f"at most {MAX_CHOICES} strings, got {len(value)}")
    if any(not c for c in value):
        raise ValueError("must not contain an empty string")
    repeated = sorted({c for c in value if value.count(c) > 1})
    if repeated:
        raise ValueError(f"must not repeat a string, got {repeated[0]!r} twice")
    from constrained.grammars.spec import choice_regex

    choice_regex(value)  # refuses control characters, naming them
    return value


def parse_logit_bias(value: Any) -> Any:
    if isinstance(value, str):  # vllm_xargs carries mappings as JSON text
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"not valid JSON ({exc.msg} at char {exc.pos})") from None
    if not isinstance(value, Mapping):
        raise ValueError(f"must be a mapping of token id to bias, got {type(value).__name__}")
    parsed: dict[int, Any] = {}
    for key, bias in value.items():
        token_id = _token_id(key)
        if isinstance(bias, bool) or not isinstance(bias, int | float):
            raise ValueError(f"bias for token {key!r} must be a number, got {bias!r}")
        bias = _finite(bias)
        if not -LOGIT_BIAS_LIMIT <= bias <= LOGIT_BIAS_LIMIT:
            raise ValueError(
                f"bias for token {token_id} is {bias}, outside "
                f"[-{LOGIT_BIAS_LIMIT:g}, {LOGIT_BIAS_LIMIT:g}]"
            )
        parsed[token_id] = bias
    return parsed


def _check_grammar_options(options: Options) -> None:
    """Refuse two constraints at once, and grammar settings that would do nothing."""
    given = [name for name in GRAMMAR_FIELDS if getattr(options, name) not in (None, False)]
    if len(given) > 1:
        raise OptionError(
            given[1], f"only one of {', '.join(GRAMMAR_FIELDS)} per request; got {given}"
        )
    if not given:
        for name in ("grammar_backend", "close_at_max_tokens", "reasoning_end",
                     "max_reasoning_tokens", *JSON_ONLY_FIELDS):  # fmt: skip
            if getattr(options, name) is not None:
                raise OptionError(name, f"has no effect without one of {', '.join(GRAMMAR_FIELDS)}")
        return
    kind = CONSTRAINT_KINDS[given[0]]
    if kind not in JSON_KINDS:
        for name in JSON_ONLY_FIELDS:
            if getattr(options, name) is not None:
                raise OptionError(
                    name, f"applies to json_schema and structural_tag only, not {given[0]}"
                )
    if options.grammar_backend not in (None, AUTO):
        kinds = get_backend(options.grammar_backend).kinds
        if kind not in kinds:
            raise OptionError(
                "grammar_backend",
                f"{options.grammar_backend} compiles {', '.join(sorted(kinds))}, not {given[0]}",
            )
    if options.max_whitespace is not None and options.whitespace != "flexible":
        raise OptionError("max_whitespace", 'needs whitespace="flexible"')


def _check_requirements(options: Options) -> None:
    """Refuse an option given without the option it modifies (it would do nothing)."""
    for name, needs in REQUIRES.items():
        if getattr(options, name) is not None and getattr(options, needs) is None:
            raise OptionError(name, f"has no effect without {needs}")
    if options.penalize_structure is not None and options.constraint() is None:
        raise OptionError(
            "penalize_structure",
            "has no effect without a constraint (json_schema, regex, grammar, choice, "
            "json_object or structural_tag): without one every token is content",
        )


def _check_token_ids(options: Options, logits_width: int) -> None:
    """Refuse token ids outside ``[0, logits_width)``."""
    for token_id in options.logit_bias or {}:
        if not 0 <= token_id < logits_width:
            raise OptionError(
                "logit_bias",
                f"token id {token_id} is outside [0, {logits_width}) (the logits width)",
            )
    for token_id in options.ngram_whitelist or ():
        if not 0 <= token_id < logits_width:
            raise OptionError(
                "ngram_whitelist",
                f"token id {token_id} is outside [0, {logits_width}) (the logits width)",
            )


def _admitted(info: ValidationInfo) -> bool:
    """Whether this parse is the engine's, of a request admission checked
    (``Options.from_extra_args``)."""
    return bool((info.context or {}).get("admitted", False))


def _resolve_aliases(extra_args: Mapping[str, Any], ours: dict[str, Any]) -> dict[str, str]:
    """Move vLLM's DeepSeek-OCR option names onto ours (in ``ours``); return field -> alias.

    A request written for that processor gets its default window (100 tokens) too."""
    aliased: dict[str, str] = {}
    for alias, name in VLLM_OCR_ALIASES.items():
        if alias not in extra_args:
            continue
        if name in extra_args:
            raise OptionError(alias, f"is vLLM's DeepSeek-OCR name for '{name}': give only one")
        value = extra_args[alias]
        if alias == "whitelist_token_ids" and isinstance(value, set | frozenset | tuple):
            value = sorted(value)
        ours[name] = value
        aliased[name] = alias
    if "ngram_size" in extra_args and "ngram_window" not in ours:
        ours["ngram_window"] = VLLM_OCR_DEFAULT_WINDOW
    return aliased


def _token_id(key: Any) -> int:
    if isinstance(key, bool):
        raise ValueError(f"token id {key!r} is not an integer")
    if isinstance(key, int):
        return key
    if isinstance(key, str):
        try:
            return int(key.strip())
        except ValueError:
            pass
    raise ValueError(f"token id {key!r} is not an integer")


def _option_error(exc: ValidationError) -> OptionError:
    """The first pydantic error, as an ``OptionError`` naming the top-level field."""
    err = exc.errors()[0]
    field = str(err["loc"][0]) if err["loc"] else "extra_args"
    message = err["msg"].removeprefix("Value error, ")
    if err["type"] not in ("value_error",) and "input" in err:
        message = f"{message} (got {err['input']!r:.80})"
    return OptionError(field, message)
