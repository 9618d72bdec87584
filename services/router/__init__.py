"""Router service: picks instant, reasoning or agentic mode for a query."""
