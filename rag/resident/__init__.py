"""The resident server of the command line: one ``rag`` server per set-up
(index, model, engine options), started in the background by the first
``rag ask``, ``rag chat`` or ``rag search`` and reached by the later ones
over a Unix socket, so they pay neither the imports nor the model loads.

``address`` says where a set-up's server lives (its runtime folder, socket
and locks), ``lifecycle`` finds, starts, lists and stops servers, ``wire``
speaks HTTP over the socket, ``client`` asks a server questions as a
pipeline would, and ``server`` is the process itself: the service's
application (``rag.service``) on that socket, stopping when idle.

Importing this package, ``address``, ``wire``, ``lifecycle`` or ``client``
imports neither the service, the index, numpy nor any model.
"""
