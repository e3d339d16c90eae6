import os, time, collections
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
os.environ.setdefault("HF_HUB_OFFLINE", "1"); os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
T = collections.defaultdict(list)
def timed(cls, name, label):
    orig = getattr(cls, name)
    def w(*a, **k):
        t = time.perf_counter(); r = orig(*a, **k); T[label].append(time.perf_counter() - t); return r
    setattr(cls, name, w)
if __name__ == "__main__":
    from vllm import LLM, SamplingParams
    from vllm.v1.sample.sampler import Sampler
    import constrained
    from constrained.processors.typical_p import TypicalPProcessor
    from benchmarks.e2e_sampling import engine_kwargs, make_prompts
    from constrained.tiny_model import build_tiny_model
    llm = LLM(model=str(build_tiny_model()), logits_processors=constrained.LOGITS_PROCESSORS, **engine_kwargs())
    runner = type(llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker.model_runner)
    timed(Sampler, "forward", "sampler"); timed(Sampler, "sample", "sample"); timed(Sampler, "apply_logits_processors", "procs")
    timed(TypicalPProcessor, "apply", "typical"); timed(runner, "execute_model", "execute"); timed(runner, "sample_tokens", "sample_tokens")
    prompts = make_prompts(64)
    for config in ({}, {"typical_p": 0.9}, {}, {"typical_p": 0.9}):
        params = [SamplingParams(temperature=1.0, seed=i, max_tokens=64, ignore_eos=True, extra_args=config or None) for i in range(64)]
        T.clear(); t = time.perf_counter(); llm.generate(prompts, params, use_tqdm=False); total = time.perf_counter() - t
        print(config, "total", round(total, 2), {k: (len(v), round(sorted(v)[len(v)//2]*1e3, 2), round(sum(v), 2)) for k, v in T.items()})
