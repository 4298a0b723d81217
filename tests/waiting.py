"""Waiting for a condition in tests: poll until it holds or a deadline passes (never a fixed sleep)."""
import time


def wait_until(condition, timeout: float, what: str, poll: float = 0.02):
    """Return the first truthy value of `condition()`; AssertionError naming `what` after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(poll)
