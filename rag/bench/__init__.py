"""Benchmarks that print figures (``rag bench NAME``), one module each:
``ttft``, ``chat``, ``serve``, ``retrieval``, ``peer``, ``search``,
``engine``, ``faults`` (the engine soaked under injected faults);
``questions`` reads question files, ``stats`` holds the shared figures,
``data/`` the bundled question sets.

Each returns DESIGN.md's bench object: ``{"bench": NAME, "config": {...},
"rows": [...], "summary": {...}}``. None asserts anything.
"""
