"""What the tests share beyond conftest's fixtures: sample documents of
every format (``samples``) and a mixed folder of them with bad inputs
(``mixed``). Developer scripts under ``tests/tools`` use them too.

Does not: import ``rag.bench`` (a test drives a bench through its command).
"""
