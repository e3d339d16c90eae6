"""A corpus of malformed requests: each must be refused naming its field, offline and served.

Each case is ``(id, xargs, builtin, field)``: our options (``extra_args`` offline,
``vllm_xargs`` over HTTP), vLLM's own request fields set beside them (``SamplingParams``
keyword offline, top-level body key served; ``structured_outputs`` is given as its ``json``
schema), and the field the error must name. Used by ``tests/test_bad_requests.py``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

NAN, INF = float("nan"), float("inf")

# A valid schema of about 5 MB (over the 4 MiB limit) and one nested 200 deep (limit 128).
HUGE_SCHEMA = json.dumps(
    {
        "type": "object",
        "properties": {
            f"p{i:06d}": {"type": "string", "description": "x" * 40} for i in range(60_000)
        },
    }
)
DEEP_SCHEMA = '{"type": "array", "items": ' * 200 + '{"type": "integer"}' + "}" * 200
LOOP_SCHEMA = json.dumps(
    {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}
)

# Its shortest complete output is about a dozen tokens.
THREE_STRINGS = json.dumps(
    {"type": "object", "required": ["first", "second", "third"],
     "properties": {k: {"type": "string"} for k in ("first", "second", "third")}}
)  # fmt: skip

# The ``contains`` its ``items`` can never meet: no array, so no instance at all.
NEVER_CONTAINED = json.dumps(
    {"type": "array", "maxItems": 1, "items": {"type": "integer", "maximum": 5},
     "contains": {"const": 7}}
)  # fmt: skip


@dataclass(frozen=True)
class Bad:
    id: str
    xargs: dict[str, Any]
    field: str
    builtin: dict[str, Any] = field(default_factory=dict)


UNIQUE = {"type": "array", "uniqueItems": True}
STRUCTURE = {"begin": "<a>", "end": "</a>", "schema": UNIQUE}
UNIQUE_TAG = json.dumps({"type": "structural_tag", "triggers": ["<a>"], "structures": [STRUCTURE]})
TRIGGERED_TAG = UNIQUE_TAG.replace('"uniqueItems": true', '"minItems": 1')
CONST_TAG = '{"type": "structural_tag", "format": {"type": "const_string", "value": "x"}}'

CORPUS: list[Bad] = [
    # unknown option names
    Bad("unknown-name", {"min_pp": 0.1}, "min_pp"),
    Bad("unknown-hyphenated", {"json-schema": "{}"}, "json-schema"),
    Bad("unknown-trailing-space", {"min_p ": 0.1}, "min_p "),
    # keys no processor of the engine reads (every one is ours): refused, not dropped
    Bad("unknown-nobody-reads", {"frobnicate_penalty": 1.0}, "frobnicate_penalty"),
    Bad("llama-cpp-name", {"repeat_penalty": 1.1}, "repeat_penalty"),
    Bad("unknown-beside-ours", {"min_p": 0.1, "frequency_penality": 0.5}, "frequency_penality"),
    # wrong types
    Bad("min_p-string", {"min_p": "high"}, "min_p"),
    Bad("min_p-numeric-string", {"min_p": "0.5"}, "min_p"),
    Bad("repetition-list", {"repetition_penalty": [1.2]}, "repetition_penalty"),
    Bad("window-float", {"penalty_last_n": 2.5}, "penalty_last_n"),
    Bad("scope-unknown", {"penalty_scope": "everything"}, "penalty_scope"),
    Bad(
        "disable-additional-string",
        {"json_schema": "{}", "disable_additional_properties": "yes"},
        "disable_additional_properties",
    ),
    Bad("close-string", {"json_schema": "{}", "close_at_max_tokens": "yes"}, "close_at_max_tokens"),
    Bad("close-without-constraint", {"close_at_max_tokens": True}, "close_at_max_tokens"),
    # choice and json_object
    Bad("choice-empty", {"choice": []}, "choice"),
    Bad("choice-repeated", {"choice": ["yes", "no", "yes"]}, "choice"),
    Bad("choice-numbers", {"choice": [1, 2]}, "choice"),
    Bad("choice-empty-string", {"choice": ["yes", ""]}, "choice"),
    Bad("choice-and-schema", {"json_schema": "{}", "choice": ["a"]}, "choice"),
    Bad("choice-whitespace", {"choice": ["a"], "whitespace": "flexible"}, "whitespace"),
    Bad("json-object-string", {"json_object": "yes"}, "json_object"),
    Bad("json-object-and-regex", {"regex": "a", "json_object": True}, "json_object"),
    # structural tags (tool calls)
    Bad("structural-tag-not-json", {"structural_tag": "{"}, "structural_tag"),
    Bad("structural-tag-not-a-tag", {"structural_tag": '{"type": "regex"}'}, "structural_tag"),
    Bad(
        "structural-tag-token-part",
        {"structural_tag": '{"type": "structural_tag", "format": {"type": "token", "token": 5}}'},
        "structural_tag",
    ),
    Bad("structural-tag-refused-keyword", {"structural_tag": UNIQUE_TAG}, "structural_tag"),
    Bad(
        "structural-tag-outlines",
        {"structural_tag": CONST_TAG, "grammar_backend": "outlines"},
        "grammar_backend",
    ),
    Bad(  # free text with triggers: xgrammar's part, not llguidance's
        "structural-tag-llguidance-triggers",
        {"structural_tag": TRIGGERED_TAG, "grammar_backend": "llguidance"},
        "structural_tag",
    ),
    # thinking first
    Bad("reasoning-end-empty", {"json_schema": "{}", "reasoning_end": " "}, "reasoning_end"),
    Bad("reasoning-end-alone", {"reasoning_end": "</think>"}, "reasoning_end"),
    Bad("max-reasoning-alone", {"regex": "a", "max_reasoning_tokens": 4}, "max_reasoning_tokens"),
    Bad("max-reasoning-unconstrained", {"max_reasoning_tokens": 4}, "max_reasoning_tokens"),
    Bad(
        "max-reasoning-negative",
        {"regex": "a", "reasoning_end": "</think>", "max_reasoning_tokens": -1},
        "max_reasoning_tokens",
    ),
    # a budget no complete output fits in (close_at_max_tokens is on by default)
    Bad(
        "max-tokens-below-shortest-output",
        {"json_schema": THREE_STRINGS},
        "max_tokens",
        builtin={"max_tokens": 3},
    ),
    # NaN and infinities
    Bad("min_p-nan", {"min_p": NAN}, "min_p"),
    Bad("repetition-inf", {"repetition_penalty": INF}, "repetition_penalty"),
    Bad("frequency-minus-inf", {"frequency_penalty": -INF}, "frequency_penalty"),
    Bad("presence-nan", {"presence_penalty": NAN}, "presence_penalty"),
    Bad("bias-nan", {"logit_bias": '{"11": NaN}'}, "logit_bias"),
    Bad("bias-inf", {"logit_bias": '{"11": Infinity}'}, "logit_bias"),
    # out of range
    Bad("min_p-above-1", {"min_p": 2.0}, "min_p"),
    Bad("min_p-negative", {"min_p": -0.1}, "min_p"),
    Bad("repetition-zero", {"repetition_penalty": 0}, "repetition_penalty"),
    Bad("repetition-past-float32", {"repetition_penalty": 1e31}, "repetition_penalty"),
    Bad("repetition-negative", {"repetition_penalty": -1.5}, "repetition_penalty"),
    Bad("presence-above-2", {"presence_penalty": 3.5}, "presence_penalty"),
    Bad("window-negative", {"penalty_last_n": -5}, "penalty_last_n"),
    Bad(
        "structure-without-constraint",
        {"frequency_penalty": 1.0, "penalize_structure": True},
        "penalize_structure",
    ),
    Bad(
        "structure-not-a-bool",
        {"json_schema": "{}", "penalize_structure": "yes"},
        "penalize_structure",
    ),
    Bad(
        "max-whitespace-17",
        {"json_schema": "{}", "whitespace": "flexible", "max_whitespace": 17},
        "max_whitespace",
    ),
    # huge values
    Bad("window-huge", {"penalty_last_n": 2**62}, "penalty_last_n"),  # vLLM refuses >64-bit itself
    Bad("frequency-huge", {"frequency_penalty": 1e300}, "frequency_penalty"),
    Bad("bias-huge", {"logit_bias": '{"11": 1e308}'}, "logit_bias"),
    # token ids
    Bad("bias-negative-id", {"logit_bias": '{"-1": 1}'}, "logit_bias"),
    Bad("bias-id-past-logits", {"logit_bias": '{"151936": 1}'}, "logit_bias"),
    Bad("bias-id-huge", {"logit_bias": '{"999999999999": 1}'}, "logit_bias"),
    Bad("bias-id-not-a-number", {"logit_bias": '{"abc": 1}'}, "logit_bias"),
    # logit_bias that is not a JSON mapping of numbers
    Bad("bias-not-json", {"logit_bias": "{not json"}, "logit_bias"),
    Bad("bias-json-list", {"logit_bias": "[1, 2]"}, "logit_bias"),
    Bad("bias-string-value", {"logit_bias": '{"5": "strong"}'}, "logit_bias"),
    # schemas that are not JSON, or not schemas
    Bad("schema-not-json", {"json_schema": "{not json"}, "json_schema"),
    # schemas no value satisfies: refused naming the keywords (not sent to raise max_tokens)
    Bad("schema-contains-never-met", {"json_schema": NEVER_CONTAINED}, "json_schema"),
    Bad(
        "schema-required-over-max",
        {"json_schema": '{"type": "object", "required": ["a", "b"], "maxProperties": 1}'},
        "json_schema",
    ),
    Bad("schema-bad-type", {"json_schema": '{"type": 12}'}, "json_schema"),
    Bad("schema-a-string", {"json_schema": '"an object please"'}, "json_schema"),
    Bad(
        "schema-negative-length",
        {"json_schema": '{"type": "string", "minLength": -1}'},
        "json_schema",
    ),
    Bad("schema-empty-text", {"json_schema": ""}, "json_schema"),
    # keywords no backend enforces
    Bad(
        "schema-uniqueItems-under-not",
        {"json_schema": '{"type": "array", "not": {"uniqueItems": true}}'},
        "json_schema",
    ),
    Bad("schema-not", {"json_schema": '{"not": {"pattern": "^a"}}'}, "json_schema"),
    Bad(
        "schema-xgrammar-allOf",
        {
            "json_schema": '{"allOf": [{"type": "object", "required": '
            '["a"]}, {"required": ["b"]}]}',
            "grammar_backend": "xgrammar",
        },
        "json_schema",
    ),
    # $ref loops and dangling refs
    Bad("schema-ref-self", {"json_schema": '{"$ref": "#"}'}, "json_schema"),
    Bad("schema-ref-loop", {"json_schema": LOOP_SCHEMA}, "json_schema"),
    Bad("schema-ref-missing", {"json_schema": '{"$ref": "#/$defs/nope"}'}, "json_schema"),
    # very large and very deep schemas
    Bad("schema-5MB", {"json_schema": HUGE_SCHEMA}, "json_schema"),
    Bad("schema-200-deep", {"json_schema": DEEP_SCHEMA}, "json_schema"),
    # regexes: invalid, unsupported, huge or explosive
    Bad("regex-unclosed", {"regex": "(unclosed"}, "regex"),
    Bad("regex-lookahead", {"regex": "(?=a)b"}, "regex"),
    Bad("regex-backreference", {"regex": "(a)\\1"}, "regex"),
    Bad("regex-huge-count", {"regex": "x{1000000}"}, "regex"),
    Bad("regex-nested-counts", {"regex": "(a|aa){1000}{1000}"}, "regex"),
    Bad("regex-empty", {"regex": "   "}, "regex"),
    # grammars that do not compile
    Bad("grammar-unclosed", {"grammar": "root ::= ("}, "grammar"),
    Bad("grammar-undefined-rule", {"grammar": "root ::= missing"}, "grammar"),
    Bad(
        "grammar-outlines",
        {"grammar": 'root ::= "a"', "grammar_backend": "outlines"},
        "grammar_backend",
    ),
    # two constraints in one request; JSON-only settings without a schema
    Bad("two-regex-schema", {"regex": "a", "json_schema": "{}"}, "regex"),
    Bad("two-regex-grammar", {"regex": "a", "grammar": 'root ::= "a"'}, "regex"),
    Bad("whitespace-without-schema", {"whitespace": "flexible"}, "whitespace"),
    Bad("backend-unknown", {"grammar_backend": "fast", "regex": "a"}, "grammar_backend"),
    # our option plus vLLM's own equivalent
    Bad("twin-min_p", {"min_p": 0.2}, "min_p", {"min_p": 0.2}),
    Bad(
        "twin-repetition",
        {"repetition_penalty": 1.3},
        "repetition_penalty",
        {"repetition_penalty": 1.3},
    ),
    Bad("twin-logit_bias", {"logit_bias": '{"11": 2}'}, "logit_bias", {"logit_bias": {"11": 2}}),
    Bad(
        "twin-structured-outputs",
        {"json_schema": '{"type": "integer"}'},
        "json_schema",
        {"structured_outputs": {"type": "integer"}},
    ),
    # the samplers: ranges, types, a modifier alone, breakers, aliases
    Bad("dry-negative", {"dry_multiplier": -0.5}, "dry_multiplier"),
    Bad("dry-base-below-one", {"dry_multiplier": 0.8, "dry_base": 0.9}, "dry_base"),
    Bad("dry-base-alone", {"dry_base": 1.75}, "dry_base"),
    Bad(
        "dry-window-minus-two",
        {"dry_multiplier": 0.8, "dry_penalty_last_n": -2},
        "dry_penalty_last_n",
    ),
    Bad(
        "dry-breaker-word",
        {"dry_multiplier": 0.8, "dry_sequence_breakers": ["User:"]},
        "dry_sequence_breakers",
    ),
    Bad(
        "dry-breakers-string",
        {"dry_multiplier": 0.8, "dry_sequence_breakers": "\n"},
        "dry_sequence_breakers",
    ),
    Bad(
        "xtc-threshold-above-half", {"xtc_probability": 0.5, "xtc_threshold": 0.6}, "xtc_threshold"
    ),
    Bad("xtc-threshold-alone", {"xtc_threshold": 0.1}, "xtc_threshold"),
    Bad("xtc-nan", {"xtc_probability": NAN}, "xtc_probability"),
    Bad("top-n-sigma-zero", {"top_n_sigma": 0}, "top_n_sigma"),
    Bad("typical-p-zero", {"typical_p": 0}, "typical_p"),
    Bad("ngram-size-zero", {"no_repeat_ngram_size": 0}, "no_repeat_ngram_size"),
    Bad("ngram-window-alone", {"ngram_window": 10}, "ngram_window"),
    Bad(
        "ngram-whitelist-id",
        {"no_repeat_ngram_size": 2, "ngram_whitelist": [151936]},
        "ngram_whitelist",
    ),
    Bad("ngram-both-names", {"ngram_size": 3, "no_repeat_ngram_size": 3}, "ngram_size"),
]
