"""The first question asked of a freshly opened Pipeline (issue 37): it waited
for the pipeline's preparation (the engine, the index and its BM25 part, the
cost model, the system prompt's prefill and a rehearsal of a question), which
``Pipeline.open`` left to the first question, inside its time to first token.
A long-lived caller opens with ``prepare=True`` (or calls ``prepare()``) and
the first question prepares nothing."""

from __future__ import annotations

from rag import Pipeline


def test_a_pipeline_opened_prepared_leaves_nothing_to_its_first_question(tmp_path, corpus, embedder, backend):
    built = Pipeline.open(tmp_path / "index", embedder=embedder, backend=backend)
    built.ingest([corpus])
    built.close()

    p = Pipeline.open(tmp_path / "index", embedder=embedder, backend=backend, prepare=True)
    try:
        assert p.engine_setup.warmed  # the system prompt is prefilled and pinned before any question
        calls = {"warm_up": 0, "rehearse": 0, "calibrate": 0}
        for name, attr in (("warm_up", "warm_up"), ("rehearse", "_rehearse")):
            original = getattr(p, attr)

            def counted(*args, _name=name, _original=original, **kwargs):
                calls[_name] += 1
                return _original(*args, **kwargs)

            setattr(p, attr, counted)
        keeper = p.costs
        original_calibrate = keeper.calibrate

        def calibrate(*args, **kwargs):
            calls["calibrate"] += 1
            return original_calibrate(*args, **kwargs)

        keeper.calibrate = calibrate
        answer = p.ask("What does prefill fill?", target_ttft=30.0, max_tokens=4)
        assert calls == {"warm_up": 0, "rehearse": 0, "calibrate": 0}
        assert answer.budget.chosen >= 1 and answer.budget.feasible
    finally:
        p.close()
