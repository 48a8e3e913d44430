"""The chat page at `/` in a real headless Chromium, against a real stack (issue 31, item 2).

The tests run in file order on one page, as a person would use it: an answer streams with its
TTFT, model and route; a repeat comes from the cache; several chats run at once and one is
stopped; a screenshot is taken (docs/page.png with FIRSTTOKEN_UPDATE_SCREENSHOT=1); then a
gateway crash mid-answer is survived by a reconnect and a `resume`, and a dropped browser
socket resumes through the gateway's cancel.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from firsttoken.procs import gateway_args
from tests.integration.conftest import Services, Stack, make_stack
from tests.support import ROOT, port_open, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.browser]

# The README's screenshot is rewritten only when asked (FIRSTTOKEN_UPDATE_SCREENSHOT=1), so a
# test run leaves the checkout as it found it.
README_SCREENSHOT = ROOT / "docs" / "page.png"
# Long answers, so one can be stopped or outlive a gateway restart: the sim writes up to
# --max-tokens tokens, one every --itl-ms; a chat's max_tokens cuts its answer shorter.
SIM_ARGS = ("--ttft-ms", "20", "--itl-ms", "10", "--max-tokens", "3000")


@pytest.fixture(scope="module")
def page_stack(
    services: Services, migrated: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    # Answers cut by max_tokens are cached too, so a short answer of a long-answer sim repeats
    # from the cache.
    with make_stack(
        services,
        migrated,
        tmp_path_factory.mktemp("logs"),
        sim_args=SIM_ARGS,
        cache_store_truncated="true",
        # The reconnect test restarts the page's only gateway: its running answer must outlive
        # the restart (behind a load balancer the page would reconnect to another at once).
        gateway_dead_after_s="30",
    ) as s:
        s.wait_ready()
        yield s


@pytest.fixture(scope="module")
def page(browser: Any, page_stack: Stack) -> Any:
    """The page, opened with the stack's API key entered."""
    from selenium.webdriver.common.by import By

    browser.get(page_stack.http + "/")
    assert browser.title == "firsttoken chat"
    browser.find_element(By.ID, "key").send_keys(page_stack.api_key)
    browser.find_element(By.ID, "save-key").click()
    # The model list comes from GET /v1/models with the key: `auto` plus the table's models.
    wait_until(lambda: len(_models(browser)) > 1, 10, what="the model list")
    assert _models(browser)[0] == "auto"
    stored = browser.execute_script("return sessionStorage.getItem('firsttoken.apiKey')")
    assert stored == page_stack.api_key
    return browser


def _models(driver: Any) -> list[str]:
    return list(
        driver.execute_script(
            "return Array.from(document.querySelectorAll('#model option'), o => o.value)"
        )
    )


def _ask(driver: Any, question: str, *, model: str | None = None, max_tokens: int = 0) -> str:
    """Type a question and press Enter; returns the new chat's id."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import Select

    if model is not None:
        Select(driver.find_element(By.ID, "model")).select_by_value(model)
    field = driver.find_element(By.ID, "max-tokens")
    field.clear()
    if max_tokens:
        field.send_keys(str(max_tokens))
    before = len(driver.find_elements(By.CSS_SELECTOR, "article.chat"))
    box = driver.find_element(By.ID, "question")
    box.send_keys(question)
    box.send_keys(Keys.ENTER)
    wait_until(
        lambda: len(driver.find_elements(By.CSS_SELECTOR, "article.chat")) > before,
        5,
        what="the new chat",
    )
    newest = driver.find_elements(By.CSS_SELECTOR, "article.chat")[-1]
    return str(newest.get_attribute("data-chat-id"))


def _chat(driver: Any, chat_id: str) -> dict[str, Any]:
    """What the page shows for one chat: its state, answer and visible badges."""
    shown: dict[str, Any] = driver.execute_script(
        """
        const el = document.querySelector(`article[data-chat-id="${arguments[0]}"]`);
        const badges = {};
        for (const b of el.querySelectorAll('.badge')) {
          if (!b.hidden) badges[b.classList[1]] = b.textContent;
        }
        return {state: el.dataset.state, answer: el.querySelector('.answer').textContent,
                badges: badges, job_id: el.dataset.jobId || null,
                stop_enabled: !el.querySelector('.stop').disabled};
        """,
        chat_id,
    )
    return shown


def _until(driver: Any, chat_id: str, states: tuple[str, ...], timeout: float) -> dict[str, Any]:
    wait_until(lambda: _chat(driver, chat_id)["state"] in states, timeout, what=f"{states}")
    return _chat(driver, chat_id)


def test_an_answer_streams_with_its_ttft_model_and_route(page: Any) -> None:
    chat_id = _ask(page, "What does the chat page show?", model="auto", max_tokens=150)
    # Seen mid-answer: text on the page, and the TTFT label, while the chat still streams.
    mid: dict[str, Any] = {}
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        shown = _chat(page, chat_id)
        if shown["state"] == "streaming" and shown["answer"]:
            mid = shown
            break
        assert shown["state"] in ("waiting", "streaming"), shown
        time.sleep(0.02)
    assert mid, "no text was shown before the answer ended"
    partial = mid["answer"]
    assert re.fullmatch(r"TTFT [\d.]+ ms", mid["badges"]["ttft"]), mid
    done = _until(page, chat_id, ("done", "failed"), 30)
    assert done["state"] == "done", done
    assert done["answer"].startswith(partial) and len(done["answer"]) > len(partial)
    badges = done["badges"]
    assert re.fullmatch(r"TTFT [\d.]+ ms · server [\d.]+ ms", badges["ttft"]), badges
    assert "cached" not in badges
    assert badges["model"].startswith("model "), badges
    assert badges["route"].startswith("route "), badges
    assert badges["usage"].endswith("150 tokens")
    assert not done["stop_enabled"]


def _cached_questions(stack: Stack) -> set[str]:
    with stack.redis() as client:
        return {
            str(client.hget(key, "q"))
            for key in client.scan_iter(f"{stack.prefix}:cache:e:*")
            if client.type(key) == "hash"
        }


def test_a_repeat_of_the_same_question_comes_from_the_cache(page: Any, page_stack: Stack) -> None:
    question = "Is the second answer cached?"
    first = _until(page, _ask(page, question, max_tokens=40), ("done",), 30)
    assert "cached" not in first["badges"]
    # The answer is stored after `done`, off the hot path; then every worker sees it within 1 s.
    # The first chat of a worker also loads the embedding model, slower on a busy machine.
    wait_until(lambda: question in _cached_questions(page_stack), 30, what="the cache entry")
    time.sleep(1.0)
    again = _until(page, _ask(page, question, max_tokens=40), ("done",), 30)
    assert again["badges"].get("cached") == "cached", again
    assert again["answer"] == first["answer"]
    assert again["badges"]["ttft"].startswith("TTFT ")


def test_several_chats_at_once_and_one_stopped(page: Any, page_stack: Stack) -> None:
    from selenium.webdriver.common.by import By

    aborted = page_stack.sim_metric("firsttoken_sim_requests_aborted_total")
    long_id = _ask(page, "Tell me a long story, please.", max_tokens=3000)
    _until(page, long_id, ("streaming",), 20)
    # A second chat on the same socket while the first streams.
    short_id = _ask(page, "And a short one meanwhile?", max_tokens=30)
    short = _until(page, short_id, ("done",), 20)
    assert short["answer"] and short["badges"]["ttft"].startswith("TTFT ")
    assert _chat(page, long_id)["state"] == "streaming"

    stop = page.find_element(By.CSS_SELECTOR, f'article[data-chat-id="{long_id}"] .stop')
    page.execute_script("arguments[0].scrollIntoView({block: 'center'})", stop)
    stop.click()
    stopped = _until(page, long_id, ("stopped", "done", "failed"), 20)
    assert stopped["state"] == "stopped", stopped
    assert stopped["badges"]["state"] == "stopped" and not stopped["stop_enabled"]
    # The cancel frame reached the worker, which aborted the engine request.
    wait_until(
        lambda: page_stack.sim_metric("firsttoken_sim_requests_aborted_total") > aborted,
        10,
        what="the sim's aborted counter",
    )
    text = stopped["answer"]
    time.sleep(0.3)
    assert _chat(page, long_id)["answer"] == text  # nothing arrives after the stop


def test_screenshot_for_the_readme(page: Any, tmp_path: Path) -> None:
    """The page after the chats above renders as a screenshot (docs/page.png when asked)."""
    update = os.environ.get("FIRSTTOKEN_UPDATE_SCREENSHOT") == "1"
    shot = README_SCREENSHOT if update else tmp_path / "page.png"
    size = page.get_window_size()
    page.set_window_size(1200, 1400)  # tall enough for every chat so far
    try:
        page.execute_script(
            "document.getElementById('question').blur();"
            "document.getElementById('chats').scrollTo(0, 0)"
        )
        assert page.save_screenshot(str(shot))
    finally:
        page.set_window_size(size["width"], size["height"])
    assert shot.stat().st_size > 10_000


def test_a_reconnect_resumes_the_running_answer(page: Any, page_stack: Stack) -> None:
    """The gateway dies mid-answer (no cancel is sent, the worker goes on): the page reconnects
    to the restarted gateway, sends `resume` from the last token shown, and ends up with the
    whole answer, nothing lost or doubled."""
    question = "Will this answer survive a gateway restart?"
    chat_id = _ask(page, question, max_tokens=1200)
    before = _until(page, chat_id, ("streaming",), 20)
    assert before["job_id"]

    page_stack.procs["gateway"].kill()
    wait_until(lambda: not port_open(page_stack.gateway_port), 10, what="the gateway to go")
    port = page_stack.gateway_port
    page_stack.start("gateway", gateway_args(port)["gateway"])
    wait_until(lambda: port_open(port), 30, what="the gateway to come back")

    done = _until(page, chat_id, ("done", "failed", "stopped"), 60)
    assert done["state"] == "done", done
    assert page.execute_script("return window.firsttoken.chats.get(arguments[0]).resumed", chat_id)
    assert done["answer"].startswith(before["answer"])
    assert done["badges"]["usage"].endswith("1200 tokens")
    # The same question again (from the cache, or the deterministic sim) gives the same text.
    again = _until(page, _ask(page, question, max_tokens=1200), ("done",), 60)
    assert again["answer"] == done["answer"]


def test_a_dropped_browser_connection_resumes_what_was_written(page: Any) -> None:
    """The browser's own socket drops mid-answer: the gateway cancels the chat (a disconnect
    always does), and the page, reconnected, replays the rest of the job's log after the last
    token shown, through the cancel, instead of hanging on a chat that no longer runs."""
    chat_id = _ask(page, "What happens when my wifi drops?", max_tokens=1500)
    before = _until(page, chat_id, ("streaming",), 20)
    page.execute_script("window.firsttoken.dropConnection()")
    ended = _until(page, chat_id, ("done", "failed", "stopped"), 30)
    assert ended["state"] == "stopped", ended
    assert ended["answer"].startswith(before["answer"])
    assert page.execute_script("return window.firsttoken.chats.get(arguments[0]).resumed", chat_id)
    wait_until(
        lambda: (
            page.execute_script("return document.getElementById('conn').dataset.state") == "open"
        ),
        10,
        what="the socket to reopen",
    )


def test_typing_a_question_sends_a_draft_and_nothing_is_shown_for_it(
    page: Any, page_stack: Stack
) -> None:
    """Issue 34: a pause in typing sends the question so far as a `draft` (the gateway then
    marks it its conversation's newest); the page shows no chat and no notice for it."""
    from selenium.webdriver.common.by import By

    def newest_drafts() -> int:
        with page_stack.redis() as client:
            return len(list(client.scan_iter(f"{page_stack.prefix}:draft:latest:*")))

    before = len(page.find_elements(By.CSS_SELECTOR, "article.chat"))
    box = page.find_element(By.ID, "question")
    box.send_keys("a question still being typed")
    wait_until(lambda: newest_drafts() > 0, 10, what="the page's draft")
    assert len(page.find_elements(By.CSS_SELECTOR, "article.chat")) == before
    assert not page.find_element(By.ID, "notice").text
    box.clear()
