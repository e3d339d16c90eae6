"""Our processors on vLLM's real Model Runner V2 sampling code, on CPU (Triton interpreter).

``harness`` patches Triton and torch globally when imported, so it is only ever imported in a
subprocess: ``python -m tests.v2_real.scenarios NAME`` (see ``tests/test_v2_real_sampler.py``).
Nothing in this package file imports vLLM.
"""
