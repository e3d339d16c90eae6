"""A short soak of our server (``tests/soak.py``): 64 concurrent clients, mixed options,
bad requests and dropped streams, a KV cache small enough to force preemption.

Asserts every check of the soak (no error for a good request, valid constrained outputs,
seeded probes equal to their runs alone, bad requests refused naming the field, no state
left in our processors after each round, bounded compile cache, memory held to round 1's
after a warm-up that sends each constraint of the mix once, healthy at the end) and that
the load really preempted requests. The full run and its figures are in
``docs/reliability.md``.
"""

from __future__ import annotations

import pytest

from tests import soak


@pytest.mark.engine
def test_short_soak_keeps_serving_and_loses_nothing(served, tiny_model_dir):
    args = soak.parse_args(["--rounds", "2", "--round-s", "20", "--model", tiny_model_dir])
    report = soak.run(args, served)
    assert report["failures"] == []
    assert report["requests"] >= 200
    assert report["preemptions"] > 0
    totals = report["totals"]
    for kind in ("plain", "penalties", "bias", "min_p", "schema", "regex", "probe", "bad"):
        assert totals.get(f"{kind}:sent", 0) > 0, kind
    assert totals.get("schema:valid", 0) > 0 and totals.get("probe:equal", 0) > 0
    assert totals["bad:refused_naming_field"] == totals["bad:sent"]
