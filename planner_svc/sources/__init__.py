"""Where shapes come from: GGUF headers, Hugging Face configs, and their cache."""
