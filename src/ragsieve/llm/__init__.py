"""LLM access: one OpenAI-compatible client, its cache, the local default model, prompts."""
