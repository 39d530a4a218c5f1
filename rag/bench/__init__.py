"""Benchmarks that print figures (``rag bench NAME``), one module each:
``ttft``, ``chat``, ``serve``, ``retrieval``, ``peer``, ``search``,
``engine``, ``faults`` (the engine soaked under injected faults);
``data/`` holds the bundled question sets. What they judge by (question
files, grading, halves, statistics, agreement, the plot) is
:mod:`rag.evaluation`.

Each returns the bench object every ``--json`` prints: ``{"bench": NAME, "config": {...},
"rows": [...], "summary": {...}}``. None asserts anything.

Each bench module has ``run(harness, ...)``, the whole of ``rag bench NAME``
(what it measures built from its options, measured, closed; ``setup``
holds what they share and :class:`~rag.bench.setup.Harness`, the caller's
side), and ``main()``: ``python -m rag.bench.NAME`` runs the same command
with the same options.
"""
