"""Seeded requests with our options give the same tokens alone and inside any batch (issue #5).

Our processors keep per-row state (penalty counts, biases, min-p thresholds, grammar matchers)
in slots that follow vLLM's persistent batch as requests join, finish and move. A leak between
rows shows up as a seeded request whose tokens depend on its neighbours.

vLLM itself only promises that a seed makes a request reproducible; whether its tokens survive
being batched with others depends on the kernels (a batch changes matrix shapes, so float
results may change). So each *setting* (a batch layout: its size, its other requests, where
the targets sit, when requests join and finish) is first run with no options at all, and our
options are checked in exactly the settings where vLLM alone gave every target the tokens it
gets alone. Elsewhere the check is skipped, saying so. The other requests keep the same vLLM
parameters in both runs; only the options differ.
"""

from __future__ import annotations

import json
import random
import re
import uuid
from dataclasses import dataclass

import pytest
from vllm import SamplingParams

SCHEMA = {
    "type": "object",
    "properties": {
        "ok": {"type": "boolean"},
        "n": {"type": "integer", "minimum": 0, "maximum": 99},
    },
    "required": ["ok", "n"],
    "additionalProperties": False,
}
REGEX = r"[a-z]{2,6}-[0-9]{2,4}"


@dataclass(frozen=True)
class Request:
    prompt: str
    params: dict  # SamplingParams arguments, the same with and without our options
    options: dict | None = None  # our extra_args

    def sampling_params(self, with_options: bool) -> SamplingParams:
        extra = self.options if with_options else None
        return SamplingParams(**self.params, extra_args=extra)


# The seeded requests under test, one per kind of per-row state we keep. The penalties target
# samples at a low temperature: this random model's logits are nearly flat, so at 1.0 it never
# repeats a token in 24 and the penalties change nothing; at 0.1 they change almost every token.
TARGETS = {
    "penalties": Request(
        "Once upon a time",
        dict(temperature=0.1, seed=1234, max_tokens=24, ignore_eos=True),
        {
            "repetition_penalty": 1.3,
            "frequency_penalty": 0.8,
            "presence_penalty": 0.6,
            "penalty_last_n": 8,
        },
    ),
    "bias_min_p": Request(
        "The capital of France is",
        dict(temperature=1.0, seed=77, max_tokens=24, ignore_eos=True),
        {
            "logit_bias": {"11": 3.0, "13": 2.5, "198": 2.0, "220": 2.5, "15": -5.0},
            "min_p": 0.05,
        },
    ),
    "json_schema": Request(
        "Person:", dict(temperature=1.0, seed=5, max_tokens=40), {"json_schema": SCHEMA}
    ),
    "regex": Request("Code:", dict(temperature=1.0, seed=99, max_tokens=24), {"regex": REGEX}),
}

# Options of the other requests: other values of the same options, the same constraint in
# another row, and plain requests (the None entries).
FILLER_OPTIONS = [
    None,
    {"repetition_penalty": 1.8},
    {"frequency_penalty": -0.5, "presence_penalty": 1.5},
    {"logit_bias": {"11": 100.0}},
    {"repetition_penalty": 0.9, "penalty_last_n": 3, "penalty_scope": "output"},
    {"json_schema": {"type": "array", "items": {"type": "integer"}, "maxItems": 4}},
    {"min_p": 0.9},
    {"logit_bias": {"13": -100.0, "1000": 6.0, "220": 4.0}, "min_p": 0.3},
    {"regex": r"[0-9]{1,3}(,[0-9]{1,3}){0,4}"},
    None,
    {"grammar": 'root ::= ("yes" | "no") "!"'},
    {"json_schema": SCHEMA, "logit_bias": {"1": 3.0}},
    {"repetition_penalty": 1.1, "frequency_penalty": 2.0, "presence_penalty": -2.0},
    {"regex": REGEX, "min_p": 0.2},
]
FILLER_PROMPTS = [
    "Hi",
    "def fibonacci(n):",
    '{"name": "Ada", "age":',
    "1, 2, 3, 4,",
    "SELECT * FROM users WHERE id = 3 AND name LIKE 'A%' ORDER BY",
    "The quick brown fox jumps over the lazy dog, and then the dog",
    "x",
]


@dataclass(frozen=True)
class Setting:
    """A batch layout: ``size`` requests, targets at ``positions``, fillers from ``rng_seed``.

    ``joins`` (optional) gives each target the engine step at which it is added; fillers
    then join at random steps too (requests arriving while others run).
    """

    size: int
    positions: dict[str, int]
    filler_tokens: tuple[int, int]  # fillers' max_tokens range
    rng_seed: int
    joins: dict[str, int] | None = None


SETTINGS = {
    "batch-8": Setting(
        8, {"penalties": 0, "bias_min_p": 3, "json_schema": 4, "regex": 7}, (8, 40), 1
    ),
    "batch-40": Setting(
        40, {"regex": 0, "json_schema": 13, "bias_min_p": 20, "penalties": 39}, (4, 40), 2
    ),
    # Every other request ends within 5 steps while the targets run on: rows are removed and
    # the targets, placed last, are moved down into the freed rows (vLLM's condense).
    "early-finishers": Setting(
        24, {"penalties": 0, "json_schema": 21, "regex": 22, "bias_min_p": 23}, (1, 5), 3
    ),
    # Requests join and leave at different engine steps, the targets included.
    "staggered": Setting(
        20,
        {"penalties": 3, "bias_min_p": 8, "json_schema": 12, "regex": 19},
        (2, 20),
        4,
        joins={"penalties": 0, "bias_min_p": 2, "json_schema": 5, "regex": 9},
    ),
}


def layout(setting: Setting) -> list[tuple[str | None, Request, int]]:
    """The setting's requests in order: (target name or None, request, join step)."""
    rng = random.Random(setting.rng_seed)
    by_position = {pos: name for name, pos in setting.positions.items()}
    rows = []
    for i in range(setting.size):
        if i in by_position:
            name = by_position[i]
            join = setting.joins[name] if setting.joins else 0
            rows.append((name, TARGETS[name], join))
            continue
        options = FILLER_OPTIONS[(i + setting.rng_seed) % len(FILLER_OPTIONS)]
        grammar = options is not None and any(
            k in options for k in ("json_schema", "regex", "grammar")
        )
        if grammar:  # fillers end early: cut at their max_tokens, not closed or refused
            options = {**options, "close_at_max_tokens": False}
        params = dict(
            temperature=rng.choice([0.0, 0.6, 1.0, 1.4]),
            seed=rng.randrange(10_000),
            max_tokens=rng.randint(*setting.filler_tokens),
            ignore_eos=not grammar,  # a finished constraint allows only end-of-sequence
        )
        if rng.random() < 0.25:
            params.update(top_k=rng.choice([5, 50]), top_p=rng.choice([0.8, 1.0]))
        join = rng.randrange(15) if setting.joins else 0
        rows.append((None, Request(rng.choice(FILLER_PROMPTS), params, options), join))
    return rows


def run_alone(llm, with_options: bool) -> dict[str, list[int]]:
    """Each target in its own ``generate`` call."""
    return {
        name: list(
            llm.generate([req.prompt], req.sampling_params(with_options), use_tqdm=False)[0]
            .outputs[0]
            .token_ids
        )
        for name, req in TARGETS.items()
    }


def run_setting(llm, setting: Setting, with_options: bool) -> dict[str, list[int]]:
    """The targets' tokens when run in ``setting``."""
    rows = layout(setting)
    if setting.joins is None:
        outs = llm.generate(
            [req.prompt for _, req, _ in rows],
            [req.sampling_params(with_options) for _, req, _ in rows],
            use_tqdm=False,
        )
        return {
            name: list(out.outputs[0].token_ids)
            for (name, _, _), out in zip(rows, outs, strict=True)
            if name
        }
    engine = llm.llm_engine
    tag = uuid.uuid4().hex[:8]
    ids = {f"seedinv-{tag}-{i}": name for i, (name, _, _) in enumerate(rows)}
    results: dict[str, list[int]] = {}
    step = 0
    last_join = max(join for _, _, join in rows)
    while step <= last_join or engine.has_unfinished_requests():
        for i, (_, req, join) in enumerate(rows):
            if join == step:
                engine.add_request(
                    f"seedinv-{tag}-{i}", req.prompt, req.sampling_params(with_options)
                )
        for out in engine.step():
            if out.finished:
                results[out.request_id] = list(out.outputs[0].token_ids)
        step += 1
    assert set(results) == set(ids)
    return {name: results[rid] for rid, name in ids.items() if name}


class Runs:
    """Each (setting, with_options) run once per module, shared by the tests below."""

    def __init__(self, llm) -> None:
        self.llm = llm
        self._cache: dict[tuple[str, bool], dict[str, list[int]]] = {}

    def get(self, setting: str, with_options: bool) -> dict[str, list[int]]:
        key = (setting, with_options)
        if key not in self._cache:
            if setting in ("alone", "alone-again"):
                self._cache[key] = run_alone(self.llm, with_options)
            else:
                self._cache[key] = run_setting(self.llm, SETTINGS[setting], with_options)
        return self._cache[key]

    def differing(self, setting: str, with_options: bool) -> list[str]:
        alone = self.get("alone", with_options)
        got = self.get(setting, with_options)
        return [name for name in TARGETS if got[name] != alone[name]]


@pytest.fixture(scope="module")
def runs(llm) -> Runs:
    return Runs(llm)


def test_vllm_alone_seeded_requests_repeat(runs):
    """The ground the rest stands on: a seeded request without options, run alone twice,
    gives the same tokens (vLLM's own promise for seeds)."""
    assert runs.differing("alone-again", with_options=False) == []


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_vllm_alone_is_batch_invariant(runs, setting):
    """Where vLLM alone (no options anywhere) gives each seeded target the tokens it gets
    alone. A setting where it does not is skipped here and in the test below: vLLM's kernels,
    not our processors, change the tokens there."""
    differ = runs.differing(setting, with_options=False)
    if differ:
        pytest.skip(f"vLLM alone is not batch-invariant in {setting!r}: {differ} differ")


def test_our_options_take_effect_and_repeat(runs):
    """The targets' options really change their tokens (so the checks below are not vacuous),
    the constraints hold, and each target run alone twice gives the same tokens (no state
    left behind in a recycled row)."""
    plain, ours = runs.get("alone", False), runs.get("alone", True)
    for name in TARGETS:
        assert ours[name] != plain[name], name
    tokenizer = runs.llm.get_tokenizer()
    json_text = tokenizer.decode(ours["json_schema"], skip_special_tokens=True)
    value = json.loads(json_text)
    assert set(value) == {"ok", "n"}, json_text
    regex_text = tokenizer.decode(ours["regex"], skip_special_tokens=True)
    assert re.fullmatch(REGEX, regex_text), regex_text
    assert runs.differing("alone-again", with_options=True) == []


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_seeded_request_with_options_is_batch_invariant(runs, setting):
    """In every setting where vLLM alone is batch-invariant, each target with our options
    gives the tokens it gets alone, whatever options its neighbours carry, wherever it
    sits, and however rows join, finish and move around it."""
    if runs.differing(setting, with_options=False):
        pytest.skip(f"vLLM alone is not batch-invariant in {setting!r}; nothing to compare")
    assert runs.differing(setting, with_options=True) == [], f"tokens differ in {setting!r}"
