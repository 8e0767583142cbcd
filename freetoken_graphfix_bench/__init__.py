"""The measuring tools: ``freetoken-graphfix bench <benchmark>``. The shim never imports anything here.

One subpackage per benchmark that has rooms of its own: ``rig/`` (a decode-like graph on FreeToken's
real graph runner and PLE table: replay cost per mode, the first-launch matrix), ``engine/`` (FreeToken's
real engine, a process per arm: running, judging, the report, the child it runs) and ``serve/`` (a real
``ft serve`` per arm). Beside them what they share: ``records`` (what a run saves and ``bench report``
reads back), ``reports`` (a record's report, one path for runs and saved records), ``arms`` (every fact
about an arm), ``stats`` (maths) apart from ``verdicts`` (the words), ``timeline`` with ``cupti`` and
``nsys`` (kernel timelines from either profiler), ``cases``/``target``/``model``/``workload`` (the models
a real-engine bench runs and #775's workload), ``startup``, ``spin`` (the positive controls), and
``cli``, the entry point, built from ``registry``, the one table of benchmarks (a new one: its folder,
holding its ``Benchmark`` entry, and one line there).
"""
