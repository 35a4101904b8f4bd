"""The worker refuses to start on a clip-archive topic that is not log-compacted.

Why (issue 29): a ``{prefix}clip-archives`` created before the service made it
(by hand, by broker auto-creation) with ``cleanup.policy=delete`` keeps every
erased conversation's summaries for its whole retention: an erase's tombstone
removes nothing there. ``compactor topics`` reported it, and the worker started
without a word.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from core.settings import parse_settings
from streams import cli
from streams.kafka.admin import prepare_topics
from streams.kafka.topic_drift import refuse_clip_archives_without_compaction
from streams.topics import TopicNames

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


async def test_a_clip_archive_topic_with_cleanup_delete_stops_the_worker_before_it_starts(
    tmp_path: Path,
    kafka_bootstrap: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    prefix = f"t{uuid.uuid4().hex[:10]}."
    names = TopicNames.with_prefix(prefix)
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    try:
        topic = NewTopic(names.clip_archives, 2, 1, topic_configs={"cleanup.policy": "delete"})
        await admin.create_topics([topic])
    finally:
        await admin.close()
    config = tmp_path / "config.toml"
    config.write_text(f'[kafka]\ntopic_prefix = "{prefix}"\npartitions = 2\n')
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", kafka_bootstrap)
    monkeypatch.setenv("POSTGRES_DSN", "postgresql://nobody@127.0.0.1:1/none")
    capsys.readouterr()
    code = await asyncio.to_thread(cli.main, ["--config", str(config), "worker"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"{names.clip_archives} has cleanup.policy=delete, not compact" in err
    assert "compactor topics --apply-configs" in err

    # The fix it names: afterwards the same check lets the worker go on.
    assert (
        await asyncio.to_thread(cli.main, ["--config", str(config), "topics", "--apply-configs"])
        == 0
    )
    kafka = parse_settings({"kafka": {"topic_prefix": prefix, "partitions": 2}}).kafka
    deadline = asyncio.get_running_loop().time() + 30  # the brokers apply it shortly
    while True:
        prepared = await prepare_topics(kafka_bootstrap, kafka)
        if prepared.clip_archives_policy == "compact":
            break
        assert asyncio.get_running_loop().time() < deadline, prepared.clip_archives_policy
        await asyncio.sleep(0.2)
    refuse_clip_archives_without_compaction(prepared, names)
