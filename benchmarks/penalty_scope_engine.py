"""Penalties that spare the structure (#56), on the real engine: the evidence quoted in
docs/options.md. The tiny model's weights are random, so this shows the rule, not taste.

Three cases, each at ``--seeds`` seeds, temperature 1, in one engine:

- ``keys``: a list of objects whose schema allows extra keys, ``frequency_penalty`` 1.5:
  invented keys (objects with a key besides ``name`` / ``kind``) and the content's own
  repetition (distinct word bigrams / all bigrams inside string values), with no penalty,
  with every token penalized (``penalize_structure: true``) and with the structure spared;
- ``ngram``: the same list (no extra keys) with ``no_repeat_ngram_size`` 3: how many output
  tokens the bans changed (the first token where the output leaves the unpenalized one);
- ``whitespace``: flexible whitespace (up to 8 after ``,`` / ``:``) and a ``logit_bias`` of
  +6 on the newline token (a model that prefers newlines): newlines per output, no
  penalty against the structure spared with ``frequency_penalty`` 1.5.

    python -m benchmarks.penalty_scope_engine --seeds 32 --out DIR
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import pathlib

import jsonschema
from vllm import LLM, SamplingParams

from benchmarks.common import machine_info
from constrained.demo import engine_kwargs
from constrained.tiny_model import build_tiny_model

OPEN_LIST = {
    "type": "array", "minItems": 2, "maxItems": 4,
    "items": {"type": "object", "required": ["name", "kind"],
              "properties": {"name": {"type": "string", "maxLength": 24},
                             "kind": {"enum": ["tool", "fruit", "animal"]}}},
}  # fmt: skip
CLOSED_LIST = {**OPEN_LIST, "items": {**OPEN_LIST["items"], "additionalProperties": False}}
PENALTY = {"frequency_penalty": 1.5}
CASES = {
    "keys": (OPEN_LIST, {"none": {}, "whole": {**PENALTY, "penalize_structure": True},
                         "spared": PENALTY}),
    "ngram": (CLOSED_LIST, {"none": {}, "whole": {"no_repeat_ngram_size": 3,
                                                  "penalize_structure": True},
                            "spared": {"no_repeat_ngram_size": 3}}),
    "whitespace": (CLOSED_LIST, {"none": {"ws": True}, "spared": {"ws": True, **PENALTY}}),
}  # fmt: skip


def strings(value) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in strings(v)]
    return []


def main() -> None:
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=32)
    parser.add_argument("--out", default="benchmarks/results/penalty_scope_engine")
    args = parser.parse_args()
    llm = LLM(str(build_tiny_model()), **engine_kwargs())
    newline = llm.get_tokenizer().encode("\n")[0]
    results: dict = {}
    for case, (schema, configs) in CASES.items():
        params, keys = [], []
        for name, extra in configs.items():
            extra = dict(extra)
            if extra.pop("ws", False):
                extra.update(whitespace="flexible", max_whitespace=8, logit_bias={newline: 6.0})
            for seed in range(args.seeds):
                extra_args = {"json_schema": schema, **extra}
                params.append(
                    SamplingParams(
                        temperature=1.0, seed=seed, max_tokens=300, extra_args=extra_args
                    )
                )
                keys.append(name)
        outs = llm.generate(["List some things as JSON."] * len(params), params, use_tqdm=False)
        by_name: dict[str, list] = {name: [] for name in configs}
        for name, out in zip(keys, outs, strict=True):
            by_name[name].append(out.outputs[0])
        results[case] = {}
        plain = [list(o.token_ids) for o in by_name["none"]]
        for name, completions in by_name.items():
            docs, valid = [], 0
            for c in completions:
                try:
                    doc = json.loads(c.text)
                    jsonschema.validate(doc, schema)
                    valid += c.finish_reason == "stop"
                    docs.append(doc)
                except (ValueError, jsonschema.ValidationError):
                    pass
            words = [s.split() for d in docs for s in strings(d)]
            bigrams = [b for w in words for b in itertools.pairwise(w)]
            same = [
                common_prefix(list(c.token_ids), p) for c, p in zip(completions, plain, strict=True)
            ]
            results[case][name] = {
                "valid_and_stop": f"{valid}/{len(completions)}",
                "invented_keys": sum(set(o) - {"name", "kind"} != set() for d in docs for o in d),
                "objects": sum(len(d) for d in docs),
                "distinct_bigram_share": round(len(set(bigrams)) / max(len(bigrams), 1), 3),
                "mean_tokens": round(
                    sum(len(c.token_ids) for c in completions) / len(completions), 1
                ),
                "newlines": sum(list(c.token_ids).count(newline) for c in completions),
                "tokens_before_leaving_plain": round(sum(same) / len(same), 1),
            }
        results[case]["example"] = {n: by_name[n][0].text for n in configs}
    record = {"command": f"python -m benchmarks.penalty_scope_engine --seeds {args.seeds}",
              "machine": machine_info(), "results": results}  # fmt: skip
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "penalty_scope_engine.json").write_text(json.dumps(record, indent=1) + "\n")
    plot(results, out / "penalty_scope_engine.png")
    print(json.dumps(results, indent=1))


def common_prefix(a: list[int], b: list[int]) -> int:
    return next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )


def plot(results: dict, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(11, 3))
    panels = [("keys", "invented_keys", "objects with invented keys"),
              ("ngram", "tokens_before_leaving_plain", "tokens as unpenalized"),
              ("whitespace", "newlines", "newlines")]  # fmt: skip
    for ax, (case, metric, title) in zip(axes, panels, strict=True):
        names = [n for n in results[case] if n != "example"]
        ax.bar(names, [results[case][n][metric] for n in names])
        ax.set_title(f"{case}: {title}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
