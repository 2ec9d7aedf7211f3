"""teraio inside training frameworks, one module per framework (docs/pytorch.md).

teraio.integrations.hf: the Hugging Face Trainer (TeraioCallback). A module here imports its
framework only when it is imported itself, so `import teraio` never needs transformers.
"""
