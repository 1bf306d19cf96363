"""The stand-in engine: an OpenAI-shaped HTTP server that starts, checks its arguments and fails
like a real engine, for tests and the one-machine demo."""
