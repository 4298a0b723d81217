"""Methods: each module is one method, `run(request, engine)` a generator of events."""
