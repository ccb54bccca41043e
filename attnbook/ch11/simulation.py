"""Chapter 11.3: a scheduler simulation, static against continuous batching with chunked prefill."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ._common import finite_at_least, instance, is_int, one_of, positive_int


@dataclass
class Request:
    """A request arriving at ``arrival`` ms with ``prompt`` tokens that asks for ``output`` tokens.

    Both lengths are at least 1: the step that ends the prefill gives the first output token.
    """

    arrival: float  # ms
    prompt: int
    output: int
    first_token: float | None = None
    done: float | None = None
    prefilled: int = 0
    generated: int = 0

    def __post_init__(self) -> None:
        self.arrival = finite_at_least("arrival", self.arrival)
        self.prompt, self.output = positive_int("prompt", self.prompt), positive_int("output", self.output)


@dataclass(frozen=True)
class StepCost:
    """Time of one forward step of a memory-bound decoder: a fixed part (reading the weights) plus
    a part per token processed in the step (prefill tokens and decoded tokens alike)."""

    fixed_ms: float = 20.0
    per_token_ms: float = 0.05

    def __post_init__(self) -> None:
        if finite_at_least("fixed_ms", self.fixed_ms) <= 0:  # a step that takes no time lets time stand still
            raise ValueError(f"fixed_ms must be > 0, got {self.fixed_ms!r}")
        finite_at_least("per_token_ms", self.per_token_ms)

    def __call__(self, tokens: int) -> float:
        return self.fixed_ms + self.per_token_ms * positive_int("tokens", tokens, minimum=0)


def poisson_arrivals(n: int, rate_per_s: float, mix: Sequence[tuple[int, int]], seed: int) -> list[Request]:
    """``n`` requests arriving as a Poisson process of ``rate_per_s`` per second, with (prompt, output)
    lengths from the first ``n`` pairs of ``mix`` (which must hold at least ``n``)."""
    n = positive_int("n", n, minimum=0)
    if finite_at_least("rate_per_s", rate_per_s) <= 0:
        raise ValueError(f"rate_per_s must be > 0, got {rate_per_s!r}")
    if len(mix) < n:
        raise ValueError(f"mix holds {len(mix)} (prompt, output) pairs but n = {n} requests were asked for")
    if not is_int(seed):
        raise ValueError(f"seed must be an int, got {seed!r}")
    if not math.isfinite(1000.0 / rate_per_s):
        raise ValueError(f"rate_per_s = {rate_per_s!r} is too small: its mean gap of 1000 / rate ms overflows")
    rng = np.random.default_rng(seed)
    times = np.cumsum(rng.exponential(1000.0 / rate_per_s, n))
    return [Request(float(t), p, o) for t, (p, o) in zip(times, mix)]


def simulate(policy: str, requests: Sequence[Request], *, max_batch: int = 16, chunk: int = 256,
             cost: StepCost = StepCost()) -> dict[str, float]:
    """Run ``requests`` through a scheduler and return mean/p90 TTFT, mean TPOT, the longest gap
    between two tokens of a running request (ms) and the throughput (tokens/s).

    * ``"static"``: take up to ``max_batch`` waiting requests, prefill them all in one step, decode
      until the *longest* finishes, then take the next batch (finished ones idle in their slot).
    * ``"continuous"``: every step, fill free slots with waiting requests; a step decodes one token
      for every running request and spends at most ``chunk`` tokens on prefills (chunked prefill), so
      a long prompt never stalls the others' decoding for long.

    ``tpot_mean`` and ``gap_max`` are NaN when no request asks for a second token. Arguments with
    which the run could not finish (``max_batch`` or ``chunk`` below 1, a request of 0 tokens) are refused.
    """
    one_of("policy", policy, ("static", "continuous"))
    max_batch, chunk = positive_int("max_batch", max_batch), positive_int("chunk", chunk)
    instance("cost", cost, StepCost, "a StepCost")
    if not requests or not all(isinstance(r, Request) for r in requests):
        raise ValueError(f"requests must be a non-empty sequence of Request, got {requests!r:.80}")
    reqs = [Request(r.arrival, r.prompt, r.output) for r in requests]
    waiting, running, now, i = [], [], 0.0, 0
    gaps: list[float] = []  # the time of every step that gave running requests their next token
    pending = sorted(reqs, key=lambda r: r.arrival)
    while i < len(pending) or waiting or running:
        while i < len(pending) and pending[i].arrival <= now:
            waiting.append(pending[i])
            i += 1
        if not waiting and not running:
            now = pending[i].arrival
            continue
        if policy == "static":
            if not running:
                running, waiting = waiting[:max_batch], waiting[max_batch:]
                now += cost(sum(r.prompt for r in running))  # one prefill step for the batch
                for r in running:
                    r.prefilled, r.first_token, r.generated = r.prompt, now, 1
                    if r.generated == r.output:
                        r.done = now
                if all(r.done is not None for r in running):  # every output was one token: no decode step
                    running = []
                continue
            active = [r for r in running if r.generated < r.output]
            now += cost(len(active))
            gaps.append(cost(len(active)))
            for r in active:
                r.generated += 1
                if r.generated == r.output:
                    r.done = now
            if all(r.generated == r.output for r in running):
                running = []
        else:  # continuous
            while waiting and len(running) < max_batch:
                running.append(waiting.pop(0))
            decoding = [r for r in running if r.prefilled == r.prompt]
            budget, prefill_tokens, finishing = chunk, 0, []
            for r in running:
                if r.prefilled < r.prompt and budget > 0:
                    n = min(budget, r.prompt - r.prefilled)
                    r.prefilled += n
                    budget -= n
                    prefill_tokens += n
                    if r.prefilled == r.prompt:
                        finishing.append(r)  # the step that ends its prefill also gives its first token
            now += cost(len(decoding) + prefill_tokens)
            if decoding:
                gaps.append(cost(len(decoding) + prefill_tokens))
            for r in decoding:
                r.generated += 1
            for r in finishing:
                r.first_token, r.generated = now, 1
            for r in decoding + finishing:
                if r.generated == r.output:
                    r.done = now
            running = [r for r in running if r.done is None]
    ttft = np.array([r.first_token - r.arrival for r in reqs])
    tpot = np.array([(r.done - r.first_token) / (r.output - 1) for r in reqs if r.output > 1])
    span = max(r.done for r in reqs) - min(r.arrival for r in reqs)
    return {"ttft_mean": float(ttft.mean()), "ttft_p90": float(np.percentile(ttft, 90)),
            "tpot_mean": float(tpot.mean()) if tpot.size else float("nan"), "gap_max": max(gaps, default=float("nan")), "tokens_per_s": sum(r.output for r in reqs) / span * 1000}
