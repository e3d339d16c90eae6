"""``benchmarks.closing_replay``: recorded tool calls forced through the grammar processor,
closing on and off, and a digest of closing's rows (#55)."""

from __future__ import annotations

import json

import pytest

from constrained.grammars import GrammarSpec, compile_now
from constrained.grammars.closing import find_witness
from tests.test_grammar_bookkeeping import vocab

__all__ = ["vocab"]


def _recorded(vocab) -> dict:
    """Two requests of a hermes ``required`` call as the server passes it on, each output
    the tag's shortest completion then end-of-sequence."""
    from tests.test_closing_counts import server_weather_tag

    tag = server_weather_tag()
    matcher = compile_now(GrammarSpec("structural_tag", tag), vocab).matcher()
    output = [*find_witness(matcher, vocab, 60), vocab.eos_token_id]
    return {"tags": [tag, tag], "outputs": [output, list(output)]}


def test_a_replay_forces_the_recorded_tokens_and_digests_closings_rows(vocab):
    from benchmarks.closing_replay import replay, replay_once

    recorded = _recorded(vocab)
    steps = len(recorded["outputs"][0])  # both rows side by side
    result = replay(recorded, rounds=1)
    assert result["steps"] == steps and result["requests"] == 2
    assert len(result["digest"]) == 16
    assert result["ms_per_pass"]["closing"] > 0 and result["ms_per_pass"]["off"] > 0
    # a token the rows do not allow is refused, naming the request
    bad = json.loads(json.dumps(recorded))
    bad["outputs"][1][0] = bad["outputs"][1][1]
    with pytest.raises(SystemExit, match="request 1"):
        replay_once(bad["tags"], bad["outputs"], True)
