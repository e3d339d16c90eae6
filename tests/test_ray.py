"""Our processors under vLLM's Ray executor, across two Ray nodes on this machine (issue #58).

A real Ray cluster (``tests/ray_cluster.py``: a head and a second node on loopback, one CPU
and one logical GPU each) and ``LLM(..., tensor_parallel_size=2,
distributed_executor_backend="ray")``, our processors loaded from the package's entry points:
vLLM's placement group puts one rank on each node. The batch is ``tests/parallel_run.py``'s
(penalties, JSON schema closing by ``max_tokens``, regex, DRY, bias + min-p, no-repeat-ngram,
XTC + top-n-sigma, plain) plus a reasoning gate before the JSON schema, on a KV cache small
enough to preempt, once, with our options (``--no-plain``: no second run without them). It
must give the single-process engine's tokens, token for token: no difference is excused as
vLLM's own. A bad option is then refused, and the engine still serves the next request.

vLLM's CPU build refuses the Ray executor ("current platform cpu does not support ray."): its
platform has no Ray device key. The test supplies one through vLLM's platform-plugin entry
point, test-only (``tests/ray_cpu_platform.py``); everything else is vLLM's.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import pytest

pytest.importorskip("ray")  # the cluster is ``ray start``; CI has it (the ``test`` extra)

from constrained.admission import spec_of
from constrained.options import Options
from tests.parallel_run import AFTER_REFUSAL, BAD_OPTION
from tests.ray_cluster import start_cluster
from tests.test_parallel import BATCH, differing, run_layout

RAY_LAYOUT = ["--tp", "2", "--ray", "--no-plain", *BATCH]


@pytest.fixture(scope="module")
def single_reasoning(parallel_reference: dict[str, Any]) -> dict[str, Any]:
    """The reference: one worker (vLLM's default executor), the same batch (``conftest.py``,
    shared with ``tests/test_parallel.py``)."""
    return parallel_reference


@pytest.fixture(scope="module")
def on_ray(single_reasoning, tiny_model_dir: str, tmp_path_factory) -> dict[str, Any]:
    """Tensor parallel 2 under the Ray executor, a rank on each of two Ray nodes. Started
    after the reference, so only one engine runs at a time; the cluster is stopped after,
    whatever happened (every process of its two sessions killed). Prints each phase's time
    (``-s`` shows it)."""
    workdir = tmp_path_factory.mktemp("ray")
    began = time.perf_counter()
    cluster = start_cluster(workdir / "cluster")
    seconds = {"cluster_start": time.perf_counter() - began}
    try:
        began = time.perf_counter()
        result = run_layout(tiny_model_dir, workdir, RAY_LAYOUT, cluster.env)
        seconds["run_layout"] = time.perf_counter() - began
    finally:
        began = time.perf_counter()
        cluster.stop()
        seconds["cluster_stop"] = time.perf_counter() - began
    seconds.update(
        (k.removesuffix("_seconds"), v) for k, v in result.items() if k.endswith("_seconds")
    )
    print("ray phases (s):", {k: round(v, 1) for k, v in seconds.items()}, file=sys.stderr)
    return result


def test_one_rank_on_each_ray_node(on_ray: dict[str, Any]) -> None:
    digests = on_ray["digests"]
    assert sorted(digests) == ["dp0-pp0-tp0", "dp0-pp0-tp1"]
    nodes = {w: set(d["before_temperature"]["node"]) for w, d in digests.items()}
    assert all(len(n) == 1 and None not in n for n in nodes.values()), nodes
    assert nodes["dp0-pp0-tp0"] != nodes["dp0-pp0-tp1"], nodes


def test_ray_gives_the_single_process_tokens(
    on_ray: dict[str, Any], single_reasoning: dict[str, Any]
) -> None:
    reqs = single_reasoning["requests"]
    assert [r["kind"] for r in reqs][-2:] == ["reasoning_json"] * 2
    assert on_ray["preemptions"] > 0, "the small KV cache should force preemption"
    assert "plain" not in on_ray  # the batch ran once, with our options
    # Required outright (no run without options to excuse a difference as vLLM's own); the
    # batch's two requests without options are compared here too.
    assert differing(single_reasoning["options"], on_ray["options"], reqs) == []
    assert [o["finish_reason"] for o in on_ray["options"]] == [
        o["finish_reason"] for o in single_reasoning["options"]
    ]
    # Both reasoning requests thought, wrote the marker, then closed their JSON.
    for req, out in zip(reqs, on_ray["options"], strict=True):
        if req["kind"] == "reasoning_json":
            assert "</think>" in out["text"], out["text"]


def test_ranks_hand_on_identical_logits(on_ray: dict[str, Any]) -> None:
    digests = on_ray["digests"]
    for stage in ("before_temperature", "after_min_p"):
        ranks = [digests[w][stage]["sha"] for w in sorted(digests)]
        assert len(ranks[0]) > 0 and ranks[0] == ranks[1], stage


def distinct_grammars(reqs: list[dict[str, Any]]) -> int:
    """How many grammars the batch compiles: its requests' distinct constraints (the compile
    cache's key, ``GrammarSpec``; the reasoning requests share the JSON schema's)."""
    specs = {spec_of(Options.from_extra_args(r["options"])) for r in reqs if r["options"]}
    return len(specs - {None})


def test_each_node_loads_the_grammars_admission_compiled(on_ray: dict[str, Any]) -> None:
    """Our settings reached both nodes' workers from the driver (the nodes were started
    without them): each rank wrote its stats, and found every grammar of the batch in the
    store that admission wrote (one directory both nodes see, as a shared mount would be);
    none compiled."""
    expected = distinct_grammars(on_ray["requests"])
    assert expected > 0, "the batch has constraints"
    stats = on_ray["stats"]
    assert sorted(stats) == ["dp0-pp0-tp0", "dp0-pp0-tp1"]
    for s in stats.values():
        cache = s["compile_cache"]
        assert (cache["entries"], cache["compiled"], cache["loaded"]) == (expected, 0, expected)


def test_a_bad_option_is_refused_naming_it(on_ray: dict[str, Any]) -> None:
    (name,) = BAD_OPTION
    assert on_ray["refusal"].startswith("VLLMValidationError"), on_ray["refusal"]
    assert name in on_ray["refusal"], on_ray["refusal"]


def test_the_engine_serves_after_the_refusal(on_ray: dict[str, Any]) -> None:
    """The next request (the refused option, valid this time) runs to its ``max_tokens``."""
    after = on_ray["after_refusal"]
    assert after["finish_reason"] == "length", after
    assert len(after["token_ids"]) == AFTER_REFUSAL["max_tokens"], after
