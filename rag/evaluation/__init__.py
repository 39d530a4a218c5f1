"""How results are judged, apart from how they are measured: answers
graded against gold key facts (:mod:`.grading`), question files
(:mod:`.questions`), a question set's tuning and held-out halves and its
figures (:mod:`.sets`), statistics with bootstrap intervals
(:mod:`.stats`), the agreement of a spliced continuation with a full
prefill's (:mod:`.agreement`), and the TTFT chart (:mod:`.plot`).

Pure: no model, no index, no server; each function takes rows, answers or
files and returns figures. The benches (:mod:`rag.bench`) measure and call
these; the tests check them directly.
"""
