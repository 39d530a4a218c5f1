"""The resident server of the command line: one ``rag`` server per set-up
(index, model, engine options), started in the background by the first
``rag ask``, ``rag chat`` or ``rag search`` and reached by the later ones
over a Unix socket, so they pay neither the imports nor the model loads.

``address`` says where a set-up's server lives (its runtime folder, socket
and locks), ``client`` finds or starts it and asks it questions as a
pipeline would, ``server`` is the process itself: the service's application
(``rag.service``) on that socket, stopping when idle.

Importing this package, ``address`` or ``client`` imports neither the
service, the index, numpy nor any model.
"""
