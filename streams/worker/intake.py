"""Commands from the compaction topic to the scheduler, in offset order.

An unusable record is dead-lettered and still goes through the scheduler (with
no work), so its offset is acked in order with the commands around it.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Generic, TypeVar

from streams.worker.dead_letters import DeadLetters
from streams.worker.processor import Processor
from streams.worker.records import InvalidRecord, Record, decode_command
from streams.worker.scheduler import CompactionScheduler

Token = TypeVar("Token")


class CommandIntake(Generic[Token]):
    """Hands decoded commands to the scheduler; an unusable one is dead-lettered.

    Dead-lettered records still go through the scheduler (with no work), so
    their offsets are acked in order with the commands around them.
    """

    def __init__(
        self,
        processor: Processor,
        scheduler: CompactionScheduler[Token],
        dead_letters: DeadLetters,
    ) -> None:
        self._processor = processor
        self.scheduler = scheduler
        self._dead_letters = dead_letters

    async def submit(self, record: Record, partition: Hashable, token: Token) -> None:
        work = None
        conversation_id = None
        try:
            command = decode_command(record)
        except InvalidRecord as error:
            await self._dead_letters.send(record, error)
        else:
            conversation_id = command.conversation_key

            async def work() -> None:
                await self._processor.compact(command)

        await self.scheduler.submit(
            partition=partition,
            offset=record.offset,
            token=token,
            conversation_id=conversation_id,
            work=work,
        )
