"""The applications, on top of everything else: the ``delta-ray`` command line (``serve``, ``tokenize``), the
transformers/vLLM drop-in, the bundled test tokenizers and sample text. They import the Ray glue (``actors``) only
inside functions."""
