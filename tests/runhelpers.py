"""What every test of a method's events needs: the one Done, last."""
from engine.common.events import Done


def done_event(events) -> Done:
    """The Done of a method's events (a list or the generator itself, which is run to the end);
    fails unless exactly one Done comes, as the last event: the contract every method keeps."""
    events = list(events)
    at = [i for i, e in enumerate(events) if isinstance(e, Done)]
    assert at == [len(events) - 1], f"Done at {at} of {len(events)} events"
    return events[-1]
