"""``create_compactor``: the pipeline over the given ports, and the guard's limits."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from functools import partial

from core.compaction.attempt import Attempts
from core.compaction.calibration import Calibration
from core.compaction.compactor import PipelineCompactor
from core.compaction.fitting import ClipFitter
from core.compaction.offload import Offload, ThreadOffload
from core.compaction.pipeline import Pipeline
from core.compaction.summarizer import Summarizer
from core.domain.budget import BudgetConfig
from core.domain.circuit import CircuitBreaker
from core.domain.compaction import CompactionConfig, CompactionTuning
from core.domain.tokens import DEFAULT_COUNTER, TokenCounter
from core.domain.usage import DEFAULT_PRICES, ModelPrice
from core.ports.embedding import Embedder
from core.ports.model import ModelProvider
from core.ports.storage import MemoryReader
from core.provider_guard import GuardLimits, ProviderGuard


def guard_limits(
    config: CompactionTuning, tenant_weights: Mapping[str, float] | None = None
) -> GuardLimits:
    return GuardLimits(
        fair_share=config.fair_share,
        tenant_weights=dict(tenant_weights or {}),
        max_concurrent=config.max_concurrent_llm_calls,
        failure_threshold=config.provider_failure_threshold,
        cooldown_seconds=config.provider_cooldown_seconds,
        max_cooldown_seconds=config.provider_max_cooldown_seconds,
        max_wait_seconds=config.provider_max_wait_seconds,
    )


def create_compactor(
    *,
    model: ModelProvider,
    memory: MemoryReader,
    config: CompactionConfig,
    model_name: str,
    counter: TokenCounter = DEFAULT_COUNTER,
    budget: BudgetConfig | None = None,
    breaker: CircuitBreaker | None = None,
    guard: ProviderGuard | None = None,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    clock: Callable[[], float] = time.monotonic,
    tenant_weights: Mapping[str, float] | None = None,
    fallback: ModelProvider | None = None,
    prices: Mapping[str, ModelPrice] | None = None,
    embedder: Embedder | None = None,
    offload: Offload | None = None,
    calibration: Calibration | None = None,
) -> PipelineCompactor:
    """The pipeline over the given ports.

    ``budget``: the target every compaction must reach (none without it). ``sleep``
    and ``clock`` drive every wait and cool-down (a test replaces both; a sleep
    advances the clock). ``tenant_weights``: the tenants' shares of the guard's
    slots (``[[tenants]]`` ``weight``, 1 by default). ``fallback``: the model
    ``plan(..., fallback=True)`` summarises with (extractive, for a tenant whose
    LLM budget is spent; local, so unguarded). ``prices``: what a compaction's
    cost is estimated with (``[usage].prices``). ``embedder``: archived vectors.
    ``calibration``: measures ``model``'s calls; its counter replaces ``counter``.
    """
    guard = guard or ProviderGuard(guard_limits(config, tenant_weights), clock=clock, sleep=sleep)
    cooldown = config.circuit_cooldown_seconds
    breaker = breaker or CircuitBreaker(config.max_consecutive_failures, cooldown, clock=clock)
    target = budget.target_tokens if budget is not None else None
    counter = counter if calibration is None else calibration.counter
    offload = offload or ThreadOffload()  # where the text-sized steps run
    make = partial(Summarizer, config=config, sleep=sleep, counter=counter, offload=offload)
    return PipelineCompactor(
        pipeline=Pipeline(memory, config, counter, ClipFitter(config, counter, target), offload),
        attempts=Attempts(breaker, guard),
        summarizer=make(model=model, model_name=model_name, guard=guard, calibration=calibration),
        fallback=_fallback(make, fallback),
        embedder=embedder,
        prices=dict(DEFAULT_PRICES if prices is None else prices),
    )


def _fallback(make: Callable[..., Summarizer], fallback: ModelProvider | None) -> Summarizer | None:
    """The fallback's summariser: local, so unguarded, and never measured (its
    counts are the estimate itself)."""
    return None if fallback is None else make(model=fallback, model_name=fallback.name, guard=None)
