"""The worker's components as one named bundle, built by ``streams.bootstrap``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generic, TypeVar

from streams.metrics import Metrics
from streams.topics import TopicNames
from streams.worker.accounting import Accounting
from streams.worker.dead_letters import DeadLetters
from streams.worker.health import Health
from streams.worker.ingest_notices import IngestNotices
from streams.worker.intake import CommandIntake
from streams.worker.loop_watch import LoopWatch
from streams.worker.outbox import OutboxRelay
from streams.worker.processor import Processor
from streams.worker.reconciler import Reconciler
from streams.worker.requests import OperatorRequests
from streams.worker.tally_table import TallyTable

Token = TypeVar("Token")


@dataclass
class Components(Generic[Token]):
    names: TopicNames
    metrics: Metrics
    health: Health
    table: TallyTable
    dead_letters: DeadLetters
    accounting: Accounting
    relay: OutboxRelay
    processor: Processor
    intake: CommandIntake[Token]
    reconciler: Reconciler
    requests: OperatorRequests
    notices: IngestNotices = field(default_factory=IngestNotices)
    loop_watch: LoopWatch = field(default_factory=LoopWatch.lag_only)
