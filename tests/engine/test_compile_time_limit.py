"""A constraint that compiles too long fails alone, with the "compile_time_limit" code, and
its compile stops: the requests after it run as fast as before."""
import time

from engine_helpers import make_engine, random_prompts, run_to_completion
from tamis.constrain import StructuredOutputsParams
from tamis.engine.sampling_params import SamplingParams

LIMIT_S = 0.5


def _runaway(seed: int) -> StructuredOutputsParams:
    """30,000 choices: seconds of compiling, far past LIMIT_S, yet well inside the automaton
    size limit (so only the time limit can stop it)."""
    return StructuredOutputsParams(choice=[f"w{seed}x{i}y" for i in range(30_000)])


def _latency(engine, prompt, repeats: int = 5) -> float:
    """The least CPU time this process spent on one of ``repeats`` runs. A compile still
    running in one of its threads would add its own CPU time to every run; other processes
    on a shared machine add none (in wall time they did: a loaded CI box once slowed every
    run 2.4x with no compile left)."""
    params = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
    times = []
    for r in range(repeats):
        start = time.process_time()
        run_to_completion(engine, [prompt], params, prefix=f"plain{time.monotonic_ns()}-")
        times.append(time.process_time() - start)
    return min(times)


def test_runaway_compiles_stop_at_the_limit_and_spare_the_rest(tiny_checkpoint):
    engine = make_engine(tiny_checkpoint("llama"), structured_outputs_time_limit_s=LIMIT_S)
    prompt = random_prompts(lengths=(12,), seed=2)[0]
    before = _latency(engine, prompt)

    start = time.perf_counter()
    outputs = run_to_completion(engine, [prompt, prompt], [
        SamplingParams(max_tokens=4, structured_outputs=_runaway(1)),
        SamplingParams(max_tokens=4, structured_outputs=_runaway(2))], prefix="runaway")
    waited = time.perf_counter() - start
    for output in outputs:
        assert output.outputs[0].finish_reason == "error"
        assert output.error_code == "compile_time_limit", output.error
        assert "time limit" in output.error
    assert waited < 3 * LIMIT_S + 2.0, f"the runaway requests took {waited:.1f}s to fail"

    compiler = engine._structured.compiler
    deadline = time.monotonic() + 1.0
    while compiler.num_compiles < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert compiler.num_compiles == 2, "a compile past its limit must stop, not run on"
    after = _latency(engine, prompt)
    assert after <= 2 * before, f"an ordinary request took {after:.2f}s of CPU after, {before:.2f}s before"
    assert engine.kv_cache.num_free_blocks == engine.kv_cache.num_blocks
