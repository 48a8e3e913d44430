"""`firsttoken bench`: load generation and measurement of the stack against the engine itself,
a naive synchronous baseline and a peer gateway (LiteLLM), all in front of the same simulator.

Modules: ``profiles`` (simulator settings), ``stats`` (pure percentile and table arithmetic),
``loadgen`` (the async drivers and the websocket client), ``direct`` (the engine's OpenAI
streaming API), ``naive`` (the synchronous before-state), ``stack`` and ``peer`` (the processes
under test), ``report`` (tables, JSON, plots), ``cli`` (the command).
"""
