"""``structural_tag``: free text, then tags whose JSON is held to our schema rules.

Without the engine: the two spellings vLLM accepts, the refusals (malformed tags, token-level
parts, schemas inside that xgrammar would not enforce, named by keyword and place), compact
whitespace inside, the special tokens a tag's delimiters spell, which backend compiles which
tag (llguidance tags of text and JSON, xgrammar the rest), and vLLM's own tool-call tags
(``get_model_structural_tag``, hermes and Qwen3.5's XML) walked token by token on each
backend that compiles them: every text they accept parses back, with vLLM's own tool parser,
into arguments that validate.
"""

from __future__ import annotations

import json

import jsonschema
import pytest

from constrained.grammars import GrammarError, GrammarSpec, compile_now, load_vocab
from constrained.grammars.checked_matcher import unwrapped
from constrained.grammars.structural_tag import literals, parse_structural_tag
from constrained.options import OptionError, Options

WIDTH = 151_936
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 20},
                   "days": {"type": "integer", "minimum": 1, "maximum": 7}},
    "required": ["city"],
    "additionalProperties": False,
}  # fmt: skip
LEGACY = {
    "type": "structural_tag",
    "triggers": ["<tool_call>"],
    "structures": [
        {"begin": '<tool_call>{"name": "get_weather", "arguments": ', "schema": WEATHER,
         "end": "}</tool_call>"},
    ],
}  # fmt: skip


@pytest.fixture(scope="module")
def vocab(tiny_model_dir):
    return load_vocab(tiny_model_dir, WIDTH)


def compiled(vocab, tag, **spec):
    return compile_now(GrammarSpec("structural_tag", Options(structural_tag=tag).structural_tag,
                                   **spec), vocab)  # fmt: skip


def accepts(grammar, vocab, text: str) -> bool:
    matcher = grammar.matcher()
    return matcher.consume(vocab.hf_tokenizer.encode(text)) and matcher.accepts_end()


def test_both_spellings_parse_to_xgrammar_format():
    legacy = parse_structural_tag(json.dumps(LEGACY))
    assert legacy["format"]["type"] == "triggered_tags"
    assert legacy["format"]["tags"][0]["content"]["json_schema"] == WEATHER
    same = parse_structural_tag(legacy)  # already xgrammar's format: unchanged
    assert same == legacy
    assert literals(legacy) >= {"<tool_call>", "}</tool_call>"}


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("{", "not valid JSON"),
        ({"type": "regex"}, '"type": "structural_tag"'),
        ({"type": "structural_tag"}, "needs"),
        ({**LEGACY, "triggers": []}, "at least one trigger"),
        ({**LEGACY, "triggers": ["<call>"]}, "no trigger starts"),
        ({**LEGACY, "extra": 1}, "unknown key"),
        ({"type": "structural_tag", "format": {"type": "tag", "begin": "a", "end": "b",
                                               "content": {"type": "nope"}}}, "malformed"),
        ({"type": "structural_tag", "format": {"type": "token", "token": 5}}, "token-level"),
        ({"type": "structural_tag", "format": {"type": "json_schema",
                                               "json_schema": {"type": 5}}}, "not a valid"),
        ({"type": "structural_tag", "format": {"type": "or", "elements": []}},
         '"elements" (at /format) must list at least one'),
        ({"type": "structural_tag", "format": {"type": "tags_with_separator", "tags": [],
                                               "separator": ","}}, '"tags" (at /format)'),
        ({"type": "structural_tag", "format": {"type": "tag", "begin": "a", "end": [],
                                               "content": {"type": "const_string", "value": "x"}}},
         '"end" (at /format)'),
    ],
)  # fmt: skip
def test_malformed_tags_are_refused_naming_the_field(value, message):
    with pytest.raises(OptionError) as error:
        Options.from_extra_args({"structural_tag": value})
    assert error.value.field == "structural_tag"
    assert message in str(error.value)


def test_a_backend_that_compiles_no_tag_is_refused_by_name():
    with pytest.raises(OptionError) as error:
        Options.from_extra_args({"structural_tag": LEGACY, "grammar_backend": "outlines"})
    assert error.value.field == "grammar_backend" and "structural_tag" in str(error.value)
    assert Options.from_extra_args({"structural_tag": LEGACY, "whitespace": "flexible"})
    assert Options.from_extra_args({"structural_tag": LEGACY, "grammar_backend": "llguidance"})


# A tag of text and JSON alone: what llguidance compiles (``structural_tag_lark``).
JSON_TAG = {"type": "structural_tag", "format": {
    "type": "tag", "begin": "<tool_call>", "end": "</tool_call>",
    "content": {"type": "json_schema", "json_schema": WEATHER}}}  # fmt: skip


def test_json_style_calls_compile_on_llguidance_the_rest_on_xgrammar(vocab):
    """``auto`` takes the first backend that compiles a tag: llguidance for tags of text and
    JSON (hermes calls), xgrammar for free text with triggers and XML-style parameters; asked
    for by name, llguidance names the part it does not compile and where it is."""
    backend = {
        name: unwrapped(compiled(vocab, tag)).backend
        for name, tag in [
            ("hermes required", vllm_tag("hermes", "required", WEATHER)),
            ("json tag", JSON_TAG),
            ("hermes auto", vllm_tag("hermes", "auto", WEATHER)),
            ("qwen xml required", vllm_tag("qwen_3_5", "required", WEATHER)),
            ("legacy", LEGACY),
        ]
    }
    assert backend == {"hermes required": "llguidance", "json tag": "llguidance",
                       "hermes auto": "xgrammar", "qwen xml required": "xgrammar",
                       "legacy": "xgrammar"}  # fmt: skip
    with pytest.raises(GrammarError) as error:
        compiled(vocab, LEGACY, backend="llguidance")
    assert "'triggered_tags' part (at /format)" in str(error.value)
    xml = {**JSON_TAG, "format": {**JSON_TAG["format"], "content": {
        "type": "qwen_xml_parameter", "json_schema": WEATHER}}}  # fmt: skip
    with pytest.raises(GrammarError) as error:
        compiled(vocab, xml, backend="llguidance")
    assert "'qwen_xml' style (at /format/content/json_schema)" in str(error.value)


def _agree(vocab, tag: dict, texts: list[str], **spec) -> list[bool]:
    """Whether each text is accepted, the same on llguidance and on xgrammar."""
    both = [compiled(vocab, tag, backend=b, **spec) for b in ("llguidance", "xgrammar")]
    assert unwrapped(both[0]).backend == "llguidance"
    found = [[accepts(grammar, vocab, text) for text in texts] for grammar in both]
    assert found[0] == found[1], list(zip(texts, *found, strict=True))
    return found[0]


def _const(value: str) -> dict:
    return {"type": "const_string", "value": value}


def _tag(begin: str, content: dict, end) -> dict:
    return {"type": "tag", "begin": begin, "content": content, "end": end}


def test_llguidance_writes_each_part_as_xgrammar_reads_it(vocab):
    """Side by side with xgrammar, text by text: separators (none, one), at least one or
    none, stop after the first, several ends, ``or``, ``sequence``, an empty literal, and
    literals with quotes, backslashes, a DEL and non-ASCII text."""
    number = {"type": "json_schema", "json_schema": {"type": "integer"}}
    calls = [_tag("<a>", number, ["</a>", "</A>"]), _tag("<b>", _const('q"\\x\x7fé'), "</b>")]
    texts = ["", "<a>1</a>", "<a>1</A>", "<a>1</b>", '<b>q"\\x\x7fé</b>', "<a>1</a>,<a>2</a>",
             "<a>1</a><a>2</a>", "<a>1</a>,", ",<a>1</a>", "<a>1</a>,<b>q</b>"]  # fmt: skip
    for separator in ("", ","):
        for at_least_one in (False, True):
            for stop_after_first in (False, True):
                tagged = {"type": "tags_with_separator", "tags": calls, "separator": separator,
                          "at_least_one": at_least_one,
                          "stop_after_first": stop_after_first}  # fmt: skip
                found = _agree(vocab, {"type": "structural_tag", "format": tagged}, texts)
                assert found[0] is not at_least_one  # the empty text
                assert found[1] and found[2] and not found[3]
    choice = {"type": "or", "elements": [_const("yes"), _const(""), number]}
    sequence = {"type": "sequence", "elements": [_const("n="), choice, _const(";")]}
    found = _agree(vocab, {"type": "structural_tag", "format": sequence},
                   ["n=yes;", "n=;", "n=12;", "n=yes", "n=no;", "n=-3;"])  # fmt: skip
    assert found == [True, True, True, False, False, True]


def test_a_parts_own_whitespace_cap_is_kept_or_refused(vocab):
    """``max_whitespace_cnt`` on a JSON part: kept by compact JSON or by a ``max_whitespace``
    within it; a larger ``max_whitespace`` is refused, naming both, on either backend."""
    part = {**JSON_TAG["format"]["content"], "max_whitespace_cnt": 1}
    tag = {**JSON_TAG, "format": {**JSON_TAG["format"], "content": part}}
    for backend in ("llguidance", "xgrammar"):
        assert compiled(vocab, tag, backend=backend)
        assert compiled(vocab, tag, backend=backend, whitespace="flexible", max_whitespace=1)
        with pytest.raises(GrammarError) as error:
            compiled(vocab, tag, backend=backend, whitespace="flexible", max_whitespace=2)
        assert "at most 1 whitespace" in str(error.value) and "max_whitespace (2)" in str(
            error.value
        )


def test_a_keyword_refused_in_a_tag_only_xgrammar_compiles_names_xgrammar_alone(vocab):
    decimal = {**WEATHER, "properties": {**WEATHER["properties"],
                                         "t": {"type": "number", "multipleOf": 0.1}}}  # fmt: skip
    with pytest.raises(GrammarError) as error:
        compiled(vocab, vllm_tag("hermes", "auto", decimal))
    assert error.value.keyword == "multipleOf"
    assert "triggered_tags" not in str(error.value) and "xgrammar:" in str(error.value)


def test_llguidance_tags_hold_the_same_rules(vocab):
    """On llguidance a tag's JSON is compact (or capped per gap when flexible), each schema
    held as a ``json_schema`` is (a keyword it would not enforce named, with its place), and
    a special token the delimiters spell is written as itself or as its text, nowhere
    else."""
    call = '<tool_call>{"city":"Paris","days":3}</tool_call>'
    grammar = compiled(vocab, JSON_TAG, backend="llguidance")
    assert accepts(grammar, vocab, call)
    assert not accepts(grammar, vocab, call.replace('{"city":"Paris"', '{"city": "Paris"'))
    assert not accepts(grammar, vocab, call.replace('"days":3', '"days":9'))  # maximum
    assert not accepts(grammar, vocab, call.replace('"days":3', '"hours":3'))  # closed object
    assert not accepts(grammar, vocab, call + call)  # one tag
    open_weather = {k: v for k, v in WEATHER.items() if k != "additionalProperties"}
    open_tag = {**JSON_TAG, "format": {**JSON_TAG["format"], "content": {
        "type": "json_schema", "json_schema": open_weather}}}  # fmt: skip
    extra = call.replace('"days":3', '"days":3,"hours":3')
    assert accepts(compiled(vocab, open_tag, backend="llguidance"), vocab, extra)
    closed = compiled(vocab, open_tag, backend="llguidance", close_objects=True)
    assert accepts(closed, vocab, call) and not accepts(closed, vocab, extra)
    flexible = compiled(vocab, JSON_TAG, backend="llguidance", whitespace="flexible")
    assert accepts(flexible, vocab, call.replace('{"city":"Paris"', '{"city": "Paris"'))
    assert not accepts(flexible, vocab, call.replace('{"city":"Paris"', '{"city":   "Paris"'))

    tokenizer = vocab.hf_tokenizer
    open_id, close_id = tokenizer.convert_tokens_to_ids(["<tool_call>", "</tool_call>"])
    ids = tokenizer.encode(call)
    assert ids[0] == open_id and ids[-1] == close_id  # the special tokens themselves
    assert grammar.matcher().consume(ids)
    spelled = tokenizer.encode("<") + tokenizer.encode("tool_call>" + call[len("<tool_call>") :])
    assert open_id not in spelled and grammar.matcher().consume(spelled)
    inside = grammar.matcher()
    assert inside.consume(tokenizer.encode('<tool_call>{"city":"'))
    assert inside.try_consume([close_id]) == 0  # not inside a string
    assert inside.try_consume([tokenizer.convert_tokens_to_ids("<|im_start|>")]) == 0

    tags = {"type": "array", "uniqueItems": True}
    unique = {**WEATHER, "properties": {**WEATHER["properties"], "tags": tags}}
    tag = json.loads(vllm_tag("hermes", "required", unique))
    for backend in ("llguidance", "auto"):  # auto: xgrammar refuses it too, naming it
        with pytest.raises(GrammarError) as error:
            compiled(vocab, tag, backend=backend)
        assert error.value.keyword == "uniqueItems"
        assert "/format/tags/0/content/json_schema" in str(error.value)
    # ``not`` of a constant: rewritten exactly into keywords llguidance enforces
    negated = {**WEATHER, "properties": {**WEATHER["properties"], "v": {"not": {"const": 1}}}}
    grammar = compiled(vocab, vllm_tag("hermes", "required", negated), backend="llguidance")
    begin = '<tool_call>\n{"name": "get_weather", "arguments": {"city":"Oslo","v":'
    assert accepts(grammar, vocab, begin + "2}}\n</tool_call>")
    assert not accepts(grammar, vocab, begin + "1}}\n</tool_call>")


def test_free_text_then_a_compact_tag(vocab):
    grammar = compiled(vocab, LEGACY)
    call = '<tool_call>{"name": "get_weather", "arguments": {"city":"Paris","days":3}}</tool_call>'
    assert accepts(grammar, vocab, "I will look it up. " + call)
    assert accepts(grammar, vocab, "No tool needed.")  # free text may end
    assert not accepts(grammar, vocab, call.replace('"days":3', '"days":9'))  # maximum
    assert not accepts(grammar, vocab, call.replace('{"city":"Paris"', '{"city": "Paris"'))
    assert not accepts(grammar, vocab, call.replace('"days":3', '"hours":3'))  # closed object
    flexible = compiled(vocab, LEGACY, whitespace="flexible", max_whitespace=2)
    assert accepts(flexible, vocab, call.replace('{"city":"Paris"', '{"city": "Paris"'))
    assert not accepts(flexible, vocab, call.replace('{"city":"Paris"', '{"city":   "Paris"'))


def test_special_tokens_spelled_by_delimiters_are_written_as_themselves(vocab):
    grammar = compiled(vocab, LEGACY)
    tokenizer = vocab.hf_tokenizer
    tool_call = tokenizer.convert_tokens_to_ids("<tool_call>")
    written = unwrapped(grammar).written  # the backend's grammar (under the finite-number rule)
    assert written == {tool_call, tokenizer.convert_tokens_to_ids("</tool_call>")}
    ids = tokenizer.encode('<tool_call>{"name": "get_weather", "arguments": ')
    assert ids[0] == tool_call  # the special token itself triggers the tag
    matcher = grammar.matcher()
    assert matcher.consume(ids)
    im_start = tokenizer.convert_tokens_to_ids("<|im_start|>")
    assert matcher.try_consume([im_start]) == 0  # other special tokens stay masked
    assert matcher.try_consume(tokenizer.encode('{"city":"<|im_start|>"')) < len(
        tokenizer.encode('{"city":"<|im_start|>"')
    )


def test_schema_keywords_xgrammar_would_ignore_are_refused_or_rewritten(vocab):
    tags = {"type": "array", "uniqueItems": True}
    unique = {**WEATHER, "properties": {**WEATHER["properties"], "tags": tags}}
    tag = {**LEGACY, "structures": [{**LEGACY["structures"][0], "schema": unique}]}
    with pytest.raises(GrammarError) as error:
        compiled(vocab, tag)
    assert error.value.keyword == "uniqueItems"
    assert "/format/tags/0/content/json_schema" in str(error.value)
    # ``not`` of a type: rewritten exactly into keywords xgrammar enforces
    negated = {"type": "object", "properties": {"v": {"not": {"type": "string"}}},
               "required": ["v"], "additionalProperties": False}  # fmt: skip
    tag = {**LEGACY, "structures": [{**LEGACY["structures"][0], "schema": negated}]}
    grammar = compiled(vocab, tag)
    begin = '<tool_call>{"name": "get_weather", "arguments": '
    assert accepts(grammar, vocab, begin + '{"v":1}}</tool_call>')
    assert not accepts(grammar, vocab, begin + '{"v":"x"}}</tool_call>')


def vllm_tag(parser_model: str, tool_choice: str, schema: dict) -> str:
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionToolsParam
    from vllm.tool_parsers.structural_tag_registry import get_model_structural_tag
    from vllm.tool_parsers.tool_strict_level import ToolStrictLevel

    tool = {"type": "function", "function": {"name": "get_weather", "parameters": schema}}
    tag = get_model_structural_tag(
        parser_model, [ChatCompletionToolsParam.model_validate(tool)], tool_choice, False,
        strict_level=ToolStrictLevel.PARAMETER,
    )  # fmt: skip
    return json.dumps(tag.model_dump())


@pytest.mark.parametrize(
    ("parser_model", "call"),
    [
        ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city":"Oslo","days":2}}'
                   "\n</tool_call>"),
        ("qwen_3_5", "<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>"
                     "\n<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>"),
    ],
)  # fmt: skip
def test_vllm_tool_call_tags_parse_back_valid(vocab, parser_model, call):
    """vLLM's own tags for its tool parsers compile here; what they accept, the matching
    vLLM tool parser reads back into arguments valid against the tool's parameters."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.tool_parsers import ToolParserManager

    required = compiled(vocab, vllm_tag(parser_model, "required", WEATHER))
    assert accepts(required, vocab, call)
    assert not accepts(required, vocab, "Let me think.")  # a call is required
    assert not accepts(required, vocab, call.replace("Oslo", "O" * 25))  # maxLength
    auto = compiled(vocab, vllm_tag(parser_model, "auto", WEATHER))
    assert accepts(auto, vocab, "Checking. " + call) and accepts(auto, vocab, "Plain answer.")

    parser_name = "hermes" if parser_model == "hermes" else "qwen3_coder"
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}
    request = ChatCompletionRequest(model="m", messages=[], tools=[tool], tool_choice="required")
    parser = ToolParserManager.get_tool_parser(parser_name)(vocab.hf_tokenizer, request.tools)
    extracted = parser.extract_tool_calls(call, request)
    assert extracted.tools_called and len(extracted.tool_calls) == 1
    arguments = json.loads(extracted.tool_calls[0].function.arguments)
    jsonschema.validate(arguments, WEATHER)
    assert arguments == {"city": "Oslo", "days": 2}


@pytest.mark.parametrize("parser_model", ["hermes", "qwen_3_5"])
@pytest.mark.parametrize("city", [{"type": "string"}, {"type": "string", "maxLength": 20}])
def test_tool_call_text_holds_no_surrogate_bytes(vocab, parser_model, city):
    """A tool call's string argument never holds a surrogate's three bytes
    (``\\xed\\xa1\\x9b``, U+D85B), which UTF-8 forbids and xgrammar's character classes let
    in (a random walk wrote them into a hermes call): in JSON arguments and in Qwen3.5's
    raw XML text, of any length or a limited one. ``\\xe5\\xbb\\xba`` (a character) stays."""
    schema = {**WEATHER, "properties": {**WEATHER["properties"], "city": city}}
    grammar = compiled(vocab, vllm_tag(parser_model, "required", schema))
    by_bytes = {piece: token for token, piece in enumerate(vocab.token_bytes()) if piece}
    opening = {
        "hermes": '<tool_call>\n{"name": "get_weather", "arguments": {"city":"',
        "qwen_3_5": "<tool_call>\n<function=get_weather>\n<parameter=city>\n",
    }[parser_model]

    def takes(*pieces: bytes) -> bool:
        matcher = grammar.matcher()
        assert matcher.consume(vocab.hf_tokenizer.encode(opening))
        tokens = [by_bytes[piece] for piece in pieces]
        return matcher.try_consume(tokens) == len(tokens)

    assert takes(b"\xe5", b"\xbb", b"\xba")
    assert not takes(b"\xed", b"\xa1", b"\x9b")


def test_taken_over_qwen_xml_calls_start_at_their_token(vocab):
    """vLLM's auto tag for Qwen3.5's XML calls triggers on ``<tool_call>\n<function=``: a
    ``<tool_call>`` followed by anything else stays free text its parser cannot read. Taken
    over, the trigger is ``<tool_call>`` alone: once written, a valid call must follow."""
    from constrained.openai_routing import call_on_its_token

    call = ("<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n"
            "<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>")  # fmt: skip
    broken = "Checking.<tool_call><tool_call> x"
    vllms = vllm_tag("qwen_3_5", "auto", WEATHER)
    assert accepts(compiled(vocab, vllms), vocab, broken)  # what vLLM's own tag lets through
    ours = compiled(vocab, call_on_its_token(vllms))
    assert not accepts(ours, vocab, broken)
    assert accepts(ours, vocab, "Checking. " + call) and accepts(ours, vocab, "Plain answer.")
    assert accepts(ours, vocab, call + "\n" + call)
    hermes = vllm_tag("hermes", "auto", WEATHER)
    assert call_on_its_token(hermes) == hermes  # its trigger is the token already
    # With a response_format too, vLLM nests the tools' tag in an "or": cut there as well.
    nested = json.loads(vllms)
    nested["format"] = {"type": "or", "elements": [nested["format"], {"type": "any_text"}]}
    cut = json.loads(call_on_its_token(json.dumps(nested)))
    assert cut["format"]["elements"][0]["triggers"] == ["<tool_call>"]


def test_taken_over_tool_arguments_are_strict(vocab):
    """A call's arguments are held as vLLM's own xgrammar holds them: no keys beyond the
    properties a tool's object declares (Qwen3.5's XML calls name only declared parameters
    already); an object declaring none, a schema with a combinator and a response format
    beside the calls keep their meaning."""
    from constrained.openai_routing import strict_arguments

    open_weather = {k: v for k, v in WEATHER.items() if k != "additionalProperties"}
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city":"Oslo"}}\n</tool_call>'
    extra = call.replace('"Oslo"}', '"Oslo","units":"C"}')
    tag = vllm_tag("hermes", "required", open_weather)
    strict = compiled(vocab, strict_arguments(tag))
    assert accepts(strict, vocab, call) and not accepts(strict, vocab, extra)
    assert accepts(compiled(vocab, tag), vocab, extra)  # open as written
    xml = ("<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n"
           "</function>\n</tool_call>")  # fmt: skip
    qwen = strict_arguments(vllm_tag("qwen_3_5", "required", open_weather))
    assert accepts(compiled(vocab, qwen), vocab, xml)
    for model in ("hermes", "qwen_3_5"):  # closed already: the same text
        assert strict_arguments(vllm_tag(model, "required", WEATHER)) == vllm_tag(
            model, "required", WEATHER)  # fmt: skip
    # An object that declares no properties stays any object, as in vLLM's own xgrammar.
    free = {
        **open_weather,
        "properties": {**open_weather["properties"], "extra": {"type": "object"}},
    }
    strict = compiled(vocab, strict_arguments(vllm_tag("hermes", "required", free)))
    assert accepts(strict, vocab, call.replace('"Oslo"}', '"Oslo","extra":{"k":1}}'))
    assert not accepts(strict, vocab, extra)
    # Combinators stay as written; a response format beside the calls (the "or"'s second
    # element, a tag of its own here) keeps its meaning.
    nested = json.loads(vllm_tag("hermes", "required", open_weather))
    branches = {"anyOf": [open_weather, {"type": "object", "properties": {"c": {}}}]}
    nested["format"]["tags"][1]["content"]["json_schema"] = branches
    beside = {"type": "tag", "begin": "<answer>", "end": "</answer>",
              "content": {"type": "json_schema", "json_schema": open_weather}}  # fmt: skip
    nested["format"] = {"type": "or", "elements": [nested["format"], beside]}
    taken = json.loads(strict_arguments(json.dumps(nested)))
    calls, kept = taken["format"]["elements"]
    assert calls["tags"][0]["content"]["json_schema"]["additionalProperties"] is False
    assert calls["tags"][1]["content"]["json_schema"] == branches
    assert kept == beside


def test_qwen_xml_raw_text_never_reads_as_a_delimiter():
    """The raw-text grammar of XML parameters against the parser's own delimiters: a text is
    allowed exactly when nothing in it matches ``<\\s*(/\\s*)?parameter`` or ``</function>``
    (what vLLM's qwen3 parser would read as the end of the value or of the call)."""
    import random

    import regex
    import xgrammar

    from constrained.grammars.qwen_xml import _TEXT_GRAMMAR

    pieces = [chr(c) for c in range(32, 127)] + ["\n", "\t", "\x0b", "\u3000", "\xa0"]
    info = xgrammar.TokenizerInfo(pieces, xgrammar.VocabType.RAW, stop_token_ids=[0])
    grammar = xgrammar.GrammarCompiler(info).compile_grammar(_TEXT_GRAMMAR)
    delimiter = regex.compile(r"<\s*(/\s*)?parameter|</function>")
    alphabet = [*"</parametfuncion>= x", "\n", "\u3000", "\xa0"]
    tails = ["<parameter", "</parameter>", "</function>", "< / parameter >", "<p>", "</f",
             "<  parameter=", "</ function>", "<\u3000parameter"]  # fmt: skip
    rng = random.Random(0)
    for _ in range(5000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12)))
        if rng.random() < 0.4:
            text += rng.choice(tails) + "".join(rng.choice(alphabet) for _ in range(3))
        allowed = xgrammar.GrammarMatcher(grammar).accept_string(text)
        assert allowed == (delimiter.search(text) is None), repr(text)


@pytest.mark.parametrize(
    ("schema", "keyword"),
    [
        ({"type": "object", "properties": {"x": {"$ref": "#/$defs/X"}},  # recursive: stays
          "$defs": {"X": {"type": "array", "items": {"$ref": "#/$defs/X"}}}}, "$ref"),
        ({"type": "object", "properties": {"x": {"type": ["string", "integer"]}}}, "type"),
        ({"type": "object",
          "properties": {"x": {"anyOf": [{"type": "string"}, {"type": "integer"}]}}}, "type"),
        ({"type": "object", "properties": {"x": {"type": "string", "pattern": "^a"}}}, "pattern"),
        ({"type": "object", "properties": {"x": {}}}, "type"),  # a number would read as text
        ({"type": "object", "properties": {"x": {"type": "integer"}}, "minProperties": 1},
         "minProperties"),
        ({"type": "object", "properties": {}, "required": ["y"]}, "required"),
    ],
)  # fmt: skip
def test_qwen_xml_refuses_what_the_parser_would_read_differently(vocab, schema, keyword):
    with pytest.raises(GrammarError) as error:
        compiled(vocab, vllm_tag("qwen_3_5", "required", schema))
    assert error.value.keyword == keyword, str(error.value)


def test_qwen_xml_values_are_exactly_what_the_parser_reads(vocab):
    schema = {
        "type": "object",
        "properties": {
            "city": {"type": "string", "enum": ["Oslo", "Paris"]},
            "note": {"anyOf": [{"type": "string", "maxLength": 5}, {"type": "null"}]},
            "days": {"type": "integer", "minimum": 1},
            "tags": {"type": "array", "items": {"type": "string"}},
            "free": {"type": "string"},
        },
        "required": ["city"],
    }
    grammar = compiled(vocab, vllm_tag("qwen_3_5", "required", schema))
    call = "<tool_call>\n<function=get_weather>\n{}\n</function>\n</tool_call>"

    def param(name: str, value: str) -> str:
        return f"<parameter={name}>\n{value}\n</parameter>"

    ok = [param("city", "Oslo"), param("note", "abc"), param("days", "3"),
          param("tags", '["a","b"]'), param("free", "a <p>b</p> </div>")]  # fmt: skip
    assert accepts(grammar, vocab, call.format("\n".join(ok)))
    assert accepts(grammar, vocab, call.format(param("city", "Paris")))  # optional left out
    for bad in (
        param("city", " Oslo"),  # whitespace the parser would keep
        param("city", "Oslo") + "\n" + param("note", "abcdef"),  # maxLength
        param("city", "Oslo") + "\n" + param("note", "a<b"),  # no "<" under a length
        param("city", "Oslo") + "\n" + param("free", "x </parameter> y"),
        param("city", "Oslo") + "\n" + param("days", "0"),  # minimum
        param("city", "Oslo") + "\n" + param("tags", '["a", "b"]'),  # compact JSON
        param("note", "abc"),  # required city missing
    ):
        assert not accepts(grammar, vocab, call.format(bad)), bad


@pytest.mark.parametrize(
    ("parser_model", "backend"),
    [("hermes", "llguidance"), ("hermes", "xgrammar"), ("qwen_3_5", "xgrammar")],
)
def test_random_walks_through_tool_call_masks_parse_back_valid(vocab, parser_model, backend):
    """Outputs sampled at random from the masks alone (every step a uniformly drawn allowed
    token, then a witness to finish) are read back by vLLM's own tool parser into arguments
    that validate, on each backend that compiles the tag."""
    import random

    import torch
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.tool_parsers import ToolParserManager

    from constrained.grammars.closing import allowed_ids, find_witness
    from constrained.grammars.matcher import words_for

    schema = {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 8},
                       "days": {"type": "integer", "minimum": 1, "maximum": 7},
                       "units": {"type": "string", "enum": ["C", "F"]}},
        "required": ["city", "days"],
        "additionalProperties": False,
    }  # fmt: skip
    grammar = compiled(vocab, vllm_tag(parser_model, "required", schema), backend=backend)
    assert unwrapped(grammar).backend == backend
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": schema}}
    request = ChatCompletionRequest(model="m", messages=[], tools=[tool], tool_choice="required")
    name = "hermes" if parser_model == "hermes" else "qwen3_coder"
    parser = ToolParserManager.get_tool_parser(name)(vocab.hf_tokenizer, request.tools)
    bitmask = torch.zeros(1, words_for(vocab.width), dtype=torch.int32)
    rng = random.Random(1)
    for _ in range(12):
        matcher, tokens = grammar.matcher(), []
        while len(tokens) < 150:
            matcher.fill(bitmask, 0)
            allowed = allowed_ids(bitmask[0], vocab.width).nonzero()[0].tolist()
            ending = vocab.eos_token_id in allowed
            if ending and (rng.random() < 0.5 or len(allowed) == 1):
                break
            token = rng.choice([t for t in allowed if t != vocab.eos_token_id])
            assert matcher.consume([token])
            tokens.append(token)
        finish = find_witness(matcher, vocab, 256)
        assert finish is not None and matcher.consume(finish) and matcher.accepts_end()
        tokens += finish
        text = vocab.hf_tokenizer.decode(tokens, skip_special_tokens=False)
        calls = parser.extract_tool_calls(text, request).tool_calls
        assert calls, text
        for call in calls:
            jsonschema.validate(json.loads(call.function.arguments), schema)
