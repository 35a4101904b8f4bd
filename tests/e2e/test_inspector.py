"""The inspector page (/ui/) in a real headless browser against a live worker.

A person's path through it: the page loads without a token and says 401 when
asked for a conversation; with a tenant token it opens a compacted
conversation (clip-archive first, the compactions, the batches), expands a
batch into its summary and raw turns, searches the conversation's memory; the
same token cannot open another tenant's conversation of the same id, and an
admin token can, naming the tenant. The token lives in the tab's
sessionStorage only.

``COMPACTOR_INSPECTOR_SCREENSHOT=docs/inspector.png`` also writes the
screenshot the docs show (it is always written to the test's tmp dir).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import Stack, eventually
from tests.e2e.test_security import ACME, ADMIN, ENV, METRICS, SECURED, TOKENS_TOML
from tests.support.browser import chromium, require_browser
from tests.support.worker import REPO_ROOT, WorkerProcess

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(300)]

SAMPLE = REPO_ROOT / "samples" / "payments-incident.jsonl"
CONVERSATION = "support-payments-0042"
WAIT = 30  # seconds any one step may take in the browser


def inspector_worker(stack: Stack) -> WorkerProcess:
    """A secured worker with the offline extractive summariser: its summaries are
    sentences of the sample, as a real model's would be."""
    config = {section: dict(values) for section, values in stack.config().items()}
    for section, values in SECURED.items():
        config.setdefault(section, {}).update(values)
    config["summarization"].update({"provider": "extractive", "chunk_size": 8})
    # Summaries to inspect: clearing alone brings the sample's tool results under
    # the target (test_strategies_e2e shows that path).
    config["compaction"] = {"strategies": ["summarize"]}
    worker = WorkerProcess(
        stack.root,
        "ui",
        bootstrap=stack.bootstrap,
        dsn=stack.dsn,
        config=config,
        env=ENV,
        extra_toml=TOKENS_TOML,
    )
    worker.token, worker.operations_token = ADMIN, METRICS
    stack.workers.append(worker)
    return worker.start()


def sample(tenant: str, first: int | None = None) -> list[dict[str, Any]]:
    events = [json.loads(line) for line in SAMPLE.read_text().splitlines() if line.strip()]
    return [{**event, "tenant_id": tenant} for event in events[:first]]


class Page:
    """The inspector as a person uses it, through Selenium."""

    def __init__(self, driver: Any, url: str) -> None:
        from selenium.webdriver.common.by import By
        from selenium.webdriver.support import expected_conditions as shown
        from selenium.webdriver.support.ui import WebDriverWait

        self.driver, self.url, self.by, self.shown = driver, url, By, shown
        self.wait = WebDriverWait(driver, WAIT)

    def load(self) -> None:
        self.driver.get(self.url + "/ui/")
        self.wait.until(self.shown.visibility_of_element_located((self.by.ID, "find-form")))

    def field(self, element_id: str, text: str) -> None:
        box = self.driver.find_element(self.by.ID, element_id)
        box.clear()
        box.send_keys(text)

    def click(self, element_id: str) -> None:
        self.driver.find_element(self.by.ID, element_id).click()

    def use_token(self, token: str) -> None:
        self.field("token", token)
        self.click("token-save")

    def open(self, conversation: str, tenant: str = "") -> None:
        self.driver.execute_script("document.getElementById('status').hidden = true")
        self.field("conversation", conversation)
        self.field("tenant", tenant)
        self.click("open")

    def status(self) -> str:
        self.wait.until(lambda d: self._status_settled())
        return str(self.driver.find_element(self.by.ID, "status").text)

    def _status_settled(self) -> bool:
        box = self.driver.find_element(self.by.ID, "status")
        return bool(box.is_displayed() and box.text and box.text != "loading…")

    def all(self, css: str, at_least: int = 1) -> list[Any]:
        self.wait.until(lambda d: len(d.find_elements(self.by.CSS_SELECTOR, css)) >= at_least)
        return list(self.driver.find_elements(self.by.CSS_SELECTOR, css))


async def test_a_person_inspects_a_compacted_conversation_in_a_browser(
    stack: Stack, tmp_path: Path
) -> None:
    require_browser()
    worker = inspector_worker(stack)
    await worker.wait_ready(stack.names.messages)
    await stack.send_all([*sample("acme"), *sample("globex", first=4)])
    await stack.wait_for_clip_events({f"acme/{CONVERSATION}": 1}, timeout=90)

    async def compacted_and_counted() -> None:
        status, body = await worker.get(f"/conversations/{CONVERSATION}", token=ACME)
        assert status == 200 and body["compactions"] >= 1 and not body["compaction_outstanding"]
        status, _ = await worker.get(
            f"/conversations/{CONVERSATION}/history", {"tenant_id": "globex"}
        )
        assert status == 200

    await eventually(compacted_and_counted, timeout=60, what="the tally counts the compaction")
    status, body = await worker.get(f"/conversations/{CONVERSATION}/history", token="-")
    assert status == 401 and "bearer token" in body["error"]
    status, log = await worker.get(f"/conversations/{CONVERSATION}/compactions", token=ACME)
    first = log["compactions"][0]["batches"][0]["batch_id"]
    status, batch = await worker.get(f"/conversations/{CONVERSATION}/batches/{first}", token=ACME)
    assert status == 200
    shot = tmp_path / "inspector.png"
    # The batch's first raw turn, as the API has it: which turns the first batch
    # holds depends on how many compactions ran (one, or one and a continuation).
    first_turn = " ".join(batch["turns"][0]["content"].split()[:6])
    has_specifics = bool(batch["ledger"] or batch["specifics"])
    await asyncio.to_thread(browse, worker.url, shot, has_specifics, first_turn)
    target = os.environ.get("COMPACTOR_INSPECTOR_SCREENSHOT")
    if target:
        shutil.copyfile(shot, REPO_ROOT / target)


def browse(url: str, screenshot: Path, has_specifics: bool, first_turn: str) -> None:
    with chromium(1400, 1900) as driver:
        page = Page(driver, url)
        page.load()
        page.open(CONVERSATION)  # no token yet
        assert page.status().startswith("401 unauthorized"), page.status()

        page.use_token(ACME)
        page.open(CONVERSATION)
        messages = page.all("#history-list .message", at_least=2)
        assert "clip" in messages[0].get_attribute("class")  # clip-archive first
        assert "[Context Summary" in messages[0].text
        rows = page.all("#compactions-table tbody tr[data-compaction]")
        assert "extractive" in rows[0].text  # its summariser and spend
        assert "strategies: summarize −" in rows[0].text  # what each strategy freed
        facts = page.all("#overview-facts div", at_least=7)
        shown = [f.text.lower() for f in facts]  # the labels are upper case by CSS
        assert any("handed to the model" in f and "as stored" in f for f in shown), shown
        batch = page.all("#batch-list .batch")[0]
        batch.find_element(page.by.CSS_SELECTOR, ".expand").click()
        page.all("#batch-list .batch .detail .summary")
        if has_specifics:  # the specifics ledger, shown when the batch has one
            page.all("#batch-list .batch .detail .specifics li")
        turns = page.all("#batch-list .batch .detail .turns .message", at_least=2)
        assert any(first_turn in " ".join(turn.text.split()) for turn in turns), first_turn

        page.field("query", "rollout")
        page.click("search-go")
        hits = page.all("#search-results .hit")
        assert hits and all(CONVERSATION in hit.text for hit in hits)
        driver.execute_script("window.scrollTo(0, 0)")
        driver.save_screenshot(str(screenshot))

        stored = driver.execute_script("return sessionStorage.getItem('compactor.token')")
        assert stored == ACME
        assert driver.execute_script("return localStorage.length") == 0
        assert driver.get_cookies() == []

        page.open(CONVERSATION, tenant="globex")  # acme's token, globex's conversation
        assert page.status().startswith("403 forbidden"), page.status()
        page.use_token(ADMIN)
        page.open(CONVERSATION, tenant="globex")
        page.wait.until(lambda d: globex_shown(page))
        first = page.all("#history-list .message")[0]
        assert "clip" not in first.get_attribute("class")  # globex's: not compacted


def globex_shown(page: Page) -> bool:
    """Globex's four messages are drawn (not acme's, still there from before)."""
    title = page.driver.find_element(page.by.ID, "overview-title").text
    drawn = page.driver.find_elements(page.by.CSS_SELECTOR, "#history-list .message")
    return "tenant globex" in title and len(drawn) == 4
