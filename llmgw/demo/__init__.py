"""The one-machine demo: tiny model files, the server that serves them, the example catalog."""
