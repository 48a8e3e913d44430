"""Bounded conversation context: which stored turns a prompt sends, and when to summarise.

Pure selection logic (:mod:`workers.conversation.window`); the database reads and the summary
task live in ``workers/``.
"""

from workers.conversation.window import (
    StoredMessage,
    Window,
    WindowRules,
    select_window,
    summary_prompt,
)

__all__ = ["StoredMessage", "Window", "WindowRules", "select_window", "summary_prompt"]
