"""What is built on the tokenizer: batch files, chat templates, the CLI, the transformers/vLLM drop-in, the bundled test tokenizers."""
