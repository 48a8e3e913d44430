"""The bulk pool: durable writes (usage rows, messages) and the sweep that re-queues usage rows
whose task never reached a write."""
