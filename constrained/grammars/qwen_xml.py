"""Qwen3.5/3.6's XML tool-call parameters, written exactly as vLLM's ``qwen3`` parser reads them.

Qwen3.5 and Qwen3.6 call tools as ``<tool_call>\\n<function=NAME>\\n<parameter=KEY>\\nVALUE
\\n</parameter>\\n...</function>\\n</tool_call>`` (vLLM's ``qwen3_coder`` / ``qwen3_xml`` tool
parsers). vLLM's tag for it (xgrammar's ``json_schema`` part in ``qwen_xml`` style) lets
whitespace of any kind sit around a value and counts only the value against the schema,
while the parser keeps all of it but one newline on each side: ``" Oslo"`` is read back, not
``"Oslo"``, and an ``enum`` or ``maxLength`` fails. This module writes the parameters part so
that what the parser reads is what the grammar checked:

- each parameter is ``<parameter=KEY>\\n`` VALUE ``\\n</parameter>`` (the parser strips
  exactly those two newlines), one a line, in ``properties`` order, the required ones
  always, the others optional; no parameter the schema does not list;
- a parameter the parser reads as text (its ``type`` says ``string``, maybe ``null``) is raw
  text: one of its ``enum`` / ``const`` strings, ``[^<]{minLength,maxLength}`` when it has a
  length (no ``<`` at all, so nothing can close the parameter early), or any text in which
  nothing reads as a parameter or function delimiter (``<parameter``, ``</parameter``,
  ``</function>``, with the whitespace the parser's regular expression allows); never a
  surrogate's three bytes, which UTF-8 forbids and xgrammar's classes let in (``SURROGATES``);
- any other parameter is compact JSON valid against its schema (``json_value``), whose type
  the parser's coercion (``coerce_to_schema_type``: by the ``type`` it reads) gives back
  unchanged.

Local, non-recursive ``$ref`` (pydantic's ``$defs`` for every ``Enum`` field and nested
model) are inlined first (``constrained.schema.refs``); the server inlines them in the
request's ``tools`` too, before vLLM's parser reads them (``openai_routing.route``), so the
parser types each parameter by the schema enforced here. Schemas outside that ground are
refused, naming the keyword: a ``$ref`` that stays (recursive, remote; the parser types a
value by the schema as written, without following it), a parameter that may be a string and
also a number, boolean, object or array (the parser would turn ``"12"`` into 12), a
``pattern`` / ``format`` on a text parameter, and object keywords other than ``properties``,
``required`` and ``additionalProperties`` at the top.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from constrained.errors import GrammarError
from constrained.schema.negation import kinds_of
from constrained.schema.refs import inline_local_refs
from constrained.schema.walk import ANNOTATIONS

PARAMETER_CLOSE = "\n</parameter>"  # what ends a parameter's value
# Keywords a parameters object may have (besides annotations): the rest would constrain
# which parameters appear beyond "these, in this order".
TOP_KEYWORDS = frozenset({"type", "properties", "required", "additionalProperties",
                          "$defs", "definitions"})  # fmt: skip
# Keywords of a text parameter's schema that raw text can be held to exactly.
TEXT_KEYWORDS = frozenset({"type", "enum", "const", "minLength", "maxLength"})
# The JSON type names the parser's coercion may read each kind as.
_READ_AS = {
    "null": {"null"}, "boolean": {"boolean"}, "object": {"object"}, "array": {"array"},
    "integer": {"integer", "number"}, "fraction": {"number"}, "string": {"string"},
}  # fmt: skip


def xml_parameters(
    schema: Any, where: str, json_value: Callable[[Any, str], dict[str, Any]]
) -> dict[str, Any]:
    """The xgrammar part for a tool's parameters in Qwen3's XML (see the module docstring).

    ``json_value(schema, where)``: the part for one compact JSON value of ``schema``.

    Raises:
        GrammarError: naming the keyword (and where) that cannot be written exactly.
    """
    from vllm.tool_parsers.utils import extract_types_from_schema

    if schema is True or schema == {}:
        schema = {"type": "object", "properties": {}}
    if not isinstance(schema, dict):
        raise _refused("type", where, "the parameters must be an object schema")
    schema = inline_local_refs(schema)
    _refuse_refs(schema, where)
    for keyword in schema:
        if keyword not in TOP_KEYWORDS and keyword not in ANNOTATIONS:
            raise _refused(keyword, where, "only properties, required and "
                           "additionalProperties are written as XML parameters")  # fmt: skip
    if schema.get("type", "object") != "object":
        raise _refused("type", where, "the parameters must be an object")
    properties = schema.get("properties") or {}
    required = schema.get("required") or []
    missing = [name for name in required if name not in properties]
    if missing:
        raise _refused("required", where, f"{missing[0]!r} is required but not a property")
    chunks: list[tuple[dict[str, Any], bool]] = []
    for name, sub in properties.items():
        at = f"{where}/properties/{name}"
        if not name or "<" in name or ">" in name or name != name.strip() or "\n" in name:
            raise _refused("properties", at, "a parameter name the parser cannot read back")
        read_as = set(extract_types_from_schema(sub))
        value = _text(sub, at, read_as) if "string" in read_as else _json(sub, at, read_as)
        if value is None:
            value = json_value(sub, at)
        chunk = _sequence(_text_part(f"<parameter={name}>\n"), value, _text_part(PARAMETER_CLOSE))
        chunks.append((chunk, name in required))
    return _joined(chunks)


def _joined(chunks: list[tuple[dict[str, Any], bool]]) -> dict[str, Any]:
    """The chunks one a line (as Qwen's template joins parameters), the optional ones
    skippable: one alternative per chunk that may come first, then the rest, each after a
    newline."""

    def rest(start: int) -> list[dict[str, Any]]:
        after = []
        for chunk, required in chunks[start:]:
            line = _sequence(_text_part("\n"), chunk)
            after.append(line if required else {"type": "optional", "content": line})
        return after

    firsts = []
    for index, (chunk, required) in enumerate(chunks):
        firsts.append(_sequence(chunk, *rest(index + 1)))
        if required:
            break
    else:
        firsts.append(_text_part(""))  # none required: no parameter at all
    return firsts[0] if len(firsts) == 1 else {"type": "or", "elements": firsts}


def _sequence(*parts: dict[str, Any]) -> dict[str, Any]:
    return {"type": "sequence", "elements": list(parts)}


def _text_part(value: str) -> dict[str, Any]:
    return {"type": "const_string", "value": value}


def _text(schema: Any, where: str, read_as: set[str]) -> dict[str, Any]:
    """Raw text the parser reads back as this string (or ``null``) parameter."""
    if read_as - {"string", "null"}:
        raise _refused("type", where, "a parameter that may be text or a number, boolean, "
                       "object or array is read back as the parser guesses")  # fmt: skip
    if not isinstance(schema, dict) or _kinds(schema) - {"string", "null"}:
        raise _refused("type", where, "a text parameter must say it is a string")
    text = _string_branch(schema, where)
    for keyword in text:
        if keyword not in TEXT_KEYWORDS and keyword not in ANNOTATIONS:
            raise _refused(keyword, where, "raw text is held to enum, const, minLength and "
                           "maxLength only")  # fmt: skip
    values = [text["const"]] if "const" in text else text.get("enum")
    if values is not None:
        strings = [v for v in values if isinstance(v, str) and _plain(v)]
        if not strings:
            raise _refused("enum", where, "no value can be written as raw text")
        options = [{"type": "const_string", "value": v} for v in strings]
        return options[0] if len(options) == 1 else {"type": "or", "elements": options}
    low, high = text.get("minLength", 0), text.get("maxLength")
    if low or high is not None:
        high_text = "" if high is None else high
        return {"type": "regex", "pattern": f"[^<{SURROGATES}]{{{low},{high_text}}}"}
    return {"type": "grammar", "grammar": _TEXT_GRAMMAR}


def _string_branch(schema: dict, where: str) -> dict:
    """The schema's own string keywords: itself, or its one string branch beside ``null``."""
    for keyword in ("anyOf", "oneOf"):
        if keyword in schema:
            branches = [b for b in schema[keyword] if kinds_of(b) != {"null"}]
            rest = set(schema) - {keyword} - ANNOTATIONS
            if len(branches) != 1 or rest:
                raise _refused(keyword, where, "a text parameter with several string shapes")
            return branches[0]
    return schema


def _json(schema: Any, where: str, read_as: set[str]) -> dict[str, Any] | None:
    """``None`` (compact JSON) when every kind the schema allows is read back as such."""
    for kind in _kinds(schema):
        if not _READ_AS[kind] & read_as:
            raise _refused("type", where, f"a {kind} value here is not read back as one: "
                           "give the parameter a type naming it")  # fmt: skip
    return None


def _kinds(schema: Any) -> frozenset[str]:
    """The kinds of value ``schema`` may allow, through ``anyOf`` / ``oneOf`` / ``allOf``."""
    kinds = kinds_of(schema)
    if isinstance(schema, dict):
        for keyword in ("anyOf", "oneOf"):
            if isinstance(schema.get(keyword), list):
                kinds &= frozenset().union(*(_kinds(b) for b in schema[keyword]))
        for branch in schema.get("allOf") or []:
            kinds &= _kinds(branch)
    return kinds


def _refuse_refs(schema: Any, where: str) -> None:
    stack = [(where, schema)]
    while stack:
        at, node = stack.pop()
        if isinstance(node, dict):
            for key, value in node.items():
                if key in ("$ref", "$dynamicRef", "$recursiveRef"):
                    raise _refused(key, at, "vLLM's qwen3 parser types a parameter by the "
                                   "schema as written, without following references, and "
                                   "only local, non-recursive ones are inlined")  # fmt: skip
                stack.append((f"{at}/{key}", value))
        elif isinstance(node, list):
            stack.extend((f"{at}/{i}", v) for i, v in enumerate(node))


def _plain(value: str) -> bool:
    """A string that cannot be read as a delimiter (no ``<`` at all: simple and sure)."""
    return "<" not in value


def _refused(keyword: str, where: str, why: str) -> GrammarError:
    return GrammarError(
        "xgrammar", f"does not enforce keyword '{keyword}' (at {where}) in Qwen3's XML tool "
        f"calls: {why}", keyword=keyword,
    )  # fmt: skip


def _text_grammar() -> str:
    """Text in which nothing matches ``<\\s*(/\\s*)?parameter`` or ``</function>`` (so no
    parameter or function delimiter the parser knows): an automaton, one rule a state."""
    space = f"[{_SPACE_CHARS}]"
    rules = {
        "root": f'"" | [^<{SURROGATES}] root | "<" lt',
        # right after "<" (lt), or after "<" and whitespace (lt_sp)
        "lt": f'"" | "<" lt | "/" sl | "p" p1 | {space} lt_sp | {_but("</p", True)} root',
        "lt_sp": f'"" | "<" lt | "/" sl_sp | "p" p1 | {space} lt_sp | {_but("</p", True)} root',
        # right after "</" (sl): "function>" or "parameter" next is a delimiter; after "<",
        # "/" and whitespace somewhere (sl_sp): "parameter" only
        "sl": f'"" | "<" lt | "f" f1 | "p" p1 | {space} sl_sp | {_but("<fp", True)} root',
        "sl_sp": f'"" | "<" lt | "p" p1 | {space} sl_sp | {_but("<p", True)} root',
    }
    for word, state in (("parameter", "p"), ("function>", "f")):
        for k in range(1, len(word)):  # k characters of the word matched
            after = word[k]
            alternatives = ['""', '"<" lt', f"{_but('<' + after, False)} root"]
            if k + 1 < len(word):  # the last character would complete it: no transition
                alternatives.insert(2, f'"{_escape(after)}" {state}{k + 1}')
            rules[f"{state}{k}"] = " | ".join(alternatives)
    return "\n".join(f"{name} ::= {body}" for name, body in rules.items())


# xgrammar's character classes let a surrogate (U+D800-U+DFFF) in as the three bytes UTF-8
# forbids: every class of text here leaves them out, and so do JSON strings (``json_grammar``)
SURROGATES = "\\ud800-\\udfff"
_SPACE_CHARS = (
    "\\t-\\r\\x1c-\\x20\\x85\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000"
)


def _but(chars: str, and_space: bool) -> str:
    """A character class of everything but ``chars`` (and whitespace, when it has its own
    transitions)."""
    excluded = "".join(_escape(c) for c in chars) + (_SPACE_CHARS if and_space else "")
    return f"[^{excluded}{SURROGATES}]"


def _escape(char: str) -> str:
    return {"\\": "\\\\", '"': '\\"', "]": "\\]", "-": "\\-", "^": "\\^"}.get(char, char)


_TEXT_GRAMMAR = _text_grammar()
