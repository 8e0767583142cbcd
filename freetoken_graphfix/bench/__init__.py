"""The measuring tools: ``python -m freetoken_graphfix bench``. The shim never imports anything here.

One module per thing measured: ``rig`` (FreeToken's real graph runner and PLE table on a synthetic
decode graph), ``replay`` (replay cost per strategy), ``cupti`` (inter-kernel gaps), ``deadlock``
(first launches), ``startup`` (interpreter start-up), ``model`` (the synthetic qwen4_exp),
``engine`` and ``engine_child/`` (FreeToken's real engine, one process per arm), ``serve`` (a real
``ft serve`` and the OpenAI client); ``stats`` computes, ``report`` renders, ``common`` holds what they
share, ``cli`` is the entry point.
"""
