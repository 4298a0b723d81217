"""What every remote API backend shares: the API key from the environment, retries with
backoff on 429/5xx (honouring Retry-After), and one clear message per failure.

- 429, 408, 409 and 5xx replies, timeouts and dropped connections are retried up to
  `max_retries` times; the wait is the server's Retry-After (seconds or an HTTP date) when it
  sends one, else `retry_wait * 2**attempt`, never more than `max_retry_wait`.
- 401/403 end at once with AuthError (which environment variable holds the key).
- A content-policy refusal (HTTP 400 with code content_policy_violation /
  moderation_blocked, or such a message) raises Refused: the caller records it and moves on.
- A 200 reply that is not what the protocol promises raises ApiReplyError.
Keys are read from the environment only, sent in a header, and never logged or stored.
"""
from __future__ import annotations

import email.utils
import logging
import os
import time
from typing import Callable

from ..common.errors import ApiError, GapLensError, ModelLoadError

logger = logging.getLogger(__name__)

RETRY_STATUSES = frozenset({408, 409, 429})
REFUSAL_CODES = frozenset({"content_policy_violation", "moderation_blocked", "content_filter",
                           "safety_violation", "responsible_ai_policy_violation"})
REFUSAL_WORDS = ("content policy", "safety system", "moderation", "content filter", "safety filter", "nsfw")


class AuthError(ApiError):
    """HTTP 401/403: the key is missing, wrong, or not allowed to use this model."""


class ApiReplyError(ApiError):
    """The server answered 200 with something the protocol does not allow."""


class Refused(Exception):
    """The API declined this prompt on content-policy grounds (not an error of the run)."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


def api_key(*names: str) -> str | None:
    """Returns the first of the environment variables `names` that is set, else None."""
    for name in names:
        value = os.environ.get(name)
        if value:
            return value
    return None


def retry_after_seconds(value: str | None) -> float | None:
    """Returns the wait a Retry-After header asks for (delta-seconds or an HTTP date), else None."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def error_detail(status: int, text: str, data) -> tuple[str, str]:
    """Returns (code, message) from an OpenAI-style error body {"error": {"code", "message"}}
    (or a plain {"error": "..."}, HF style), else ("", the start of the body)."""
    code, message = "", (text or "").strip()[:300]
    if isinstance(data, dict):
        error = data.get("error", data)
        if isinstance(error, dict):
            code = str(error.get("code") or error.get("type") or "")
            message = str(error.get("message") or message)
        elif isinstance(error, str):
            message = error
    return code, message


def is_refusal(status: int, code: str, message: str) -> bool:
    """Whether an error reply is a content-policy refusal of the prompt (not worth retrying)."""
    if code.lower() in REFUSAL_CODES:
        return True
    return status in (400, 422) and any(w in message.lower() for w in REFUSAL_WORDS)


class Retrier:
    """Runs one HTTP attempt function with the retry policy above.

    `attempt()` returns (status, headers, text, parsed JSON or None) or raises a transport
    error; `sleep` is replaceable so tests can see the waits without waiting."""

    def __init__(self, name: str, *, max_retries: int = 4, retry_wait: float = 1.0, max_retry_wait: float = 60.0,
                 key_names: tuple[str, ...] = (), sleep: Callable[[float], None] = time.sleep):
        self.name = name
        self.max_retries = int(max_retries)
        self.retry_wait = float(retry_wait)
        self.max_retry_wait = float(max_retry_wait)
        self.key_names = key_names
        self.sleep = sleep
        self.waits: list[float] = []

    def run(self, attempt: Callable[[], tuple[int, dict, str, object]], what: str, timeout: float | None = None):
        """Returns (status, headers, text, data) of the first reply below 400. Raises Refused,
        AuthError or ApiError (after the retries) with one clear sentence."""
        tries = 0
        while True:
            wait = None
            try:
                status, headers, text, data = attempt()
            except GapLensError:
                raise   # already one clear sentence (a malformed reply, offline mode): not worth retrying
            except Exception as exc:  # noqa: BLE001 - transport errors of httpx / huggingface_hub
                kind = type(exc).__name__
                if "Timeout" in kind or "timeout" in str(exc).lower():
                    error = ApiError(f"{self.name} did not answer {what} within {timeout or '?'} s ({kind}); "
                                     "raise option timeout or check the server")
                else:
                    error = ApiError(f"cannot reach {self.name} for {what}: {kind}: {exc}. Is it running, "
                                     "and is the URL right?")
            else:
                if status < 400:
                    return status, headers, text, data
                code, message = error_detail(status, text, data)
                if is_refusal(status, code, message):
                    raise Refused(f"{code or 'refused'}: {message}" if code else message)
                if status in (401, 403):
                    keys = " or ".join(self.key_names) or "the API key variable"
                    raise AuthError(f"{self.name} answered HTTP {status} for {what}: {message}. "
                                    + ("Check the key in " + keys if status == 401 else
                                       "The key in " + keys + " is not allowed to do this") + ".")
                error = ApiError(f"{self.name} answered HTTP {status} for {what}: {message}"
                                 + (" (rate limited or out of quota)" if status == 429 else ""))
                if status not in RETRY_STATUSES and status < 500:
                    raise error
                wait = retry_after_seconds((headers or {}).get("retry-after") or (headers or {}).get("Retry-After"))
            if tries >= self.max_retries:
                raise ApiError(f"{error} (gave up after {tries + 1} attempts)")
            wait = min(self.max_retry_wait, wait if wait is not None else self.retry_wait * 2 ** tries)
            logger.warning("%s; retrying in %.1f s", error, wait)
            self.waits.append(wait)
            self.sleep(wait)
            tries += 1


def remembered_model(data_dir: str | None, base_url: str, list_models: Callable[[], list[str]],
                     pick: Callable[[list[str]], str]) -> str:
    """Returns the model to use at `base_url` when none is named: the one remembered in
    `data_dir/api_models.json`, else `pick(list_models())`, then remembered, so an identical
    request later makes no HTTP request at all (name a model with option `model` to change it)."""
    import json
    from pathlib import Path

    path = Path(data_dir) / "api_models.json" if data_dir else None
    known = {}
    if path is not None and path.exists():
        try:
            known = json.loads(path.read_text())
        except (OSError, ValueError):
            known = {}
    if isinstance(known, dict) and isinstance(known.get(base_url), str):
        return known[base_url]
    names = list_models()
    if not names:
        raise ModelLoadError(f"{base_url} lists no models at /models; name one with option model=NAME")
    model = pick(names)
    if path is not None:
        known = {**(known if isinstance(known, dict) else {}), base_url: model}
        tmp = path.with_name(f".api_models.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(known, indent=1))
        os.replace(tmp, path)
    return model


def httpx_attempt(client, method: str, url: str, **kwargs) -> tuple[int, dict, str, object]:
    """One httpx request as `Retrier.run` wants it: (status, headers, text, parsed JSON or None)."""
    response = client.request(method, url, **kwargs)
    try:
        data = response.json()
    except ValueError:
        data = None
    return response.status_code, dict(response.headers), response.text, data


def listed_models(retrier: Retrier, client, base_url: str, timeout: float) -> list[str]:
    """Returns the model ids an OpenAI-compatible server lists at GET {base_url}/models."""
    _, _, _, data = retrier.run(lambda: httpx_attempt(client, "GET", base_url + "/models"), "the model list", timeout)
    models = data.get("data", []) if isinstance(data, dict) else []
    return [m["id"] for m in models if isinstance(m, dict) and m.get("id")]
