"""Problem documents of the LMSP service (RFC 9457; LMSP 1.0, 6.1, 6.2, 6.4; docs/lmsp.md).

Rules
- Every error the service answers is an `application/problem+json` body with
  the RFC 9457 members `type` (always `about:blank`), `title` (the HTTP
  reason phrase), `status`, `detail` (a fixed sentence written here, never a
  request value, a model output, a path on disk or a credential) and
  `instance` (the request path), plus the LMSP `code` extension member.
- A route raises `ProblemError`; the application turns it into the response.
  Any other exception is a bug: it is logged and answered with the generic
  500 `internal_error` problem, without details.
- The same problem object is the `error` member of a `failed` response and
  the data of an `error` stream event (6.2, 6.3).
"""

from __future__ import annotations

from http import HTTPStatus
from typing import Any

from starlette.responses import JSONResponse

PROBLEM_MEDIA_TYPE = "application/problem+json"

# code -> (HTTP status, default detail). The detail sentences are the only
# free text a client ever sees from this service.
PROBLEM_CODES: dict[str, tuple[int, str]] = {
    "invalid_request": (400, "The request is malformed."),
    "unsupported_capability": (400, "The model does not support a feature this request needs."),
    "context_length_exceeded": (400, "The input does not fit the model's context window."),
    "unsupported_version": (400, "This service speaks LMSP 1.x only."),
    "unauthorized": (401, "A valid bearer token is required."),
    "not_found": (404, "There is no such endpoint."),
    "model_not_found": (404, "The service has no model with this id."),
    "response_not_found": (404, "There is no stored response with this id."),
    "task_not_found": (404, "There is no task with this id."),
    "method_not_allowed": (405, "This endpoint does not accept this method."),
    "idempotency_in_progress": (
        409,
        "A request with this Idempotency-Key is still being processed.",
    ),
    "event_history_expired": (
        410,
        "The requested events are older than the retention period; fetch the task instead.",
    ),
    "request_timeout": (408, "The request body did not arrive in time."),
    "payload_too_large": (413, "The request body is larger than this service accepts."),
    "unsupported_media_type": (415, "The request body must be application/json."),
    "idempotency_conflict": (
        422,
        "This Idempotency-Key was already used with a different request.",
    ),
    "server_busy": (503, "Too many generations are waiting; retry later."),
    "model_output_invalid": (500, "The model's output did not satisfy the request's constraints."),
    "generation_failed": (500, "The model failed while generating."),
    "model_crashed": (
        500,
        "The model process failed during this generation; the service restarted it.",
    ),
    "model_unavailable": (503, "The model is restarting; retry shortly."),
    "interrupted": (503, "The service stopped while generating this response; send it again."),
    "internal_error": (500, "The service failed unexpectedly."),
}


class ProblemError(Exception):
    """An LMSP failure to answer as a problem document.

    `code` is a key of `PROBLEM_CODES` (the status follows from it);
    `detail`, when given, must be a sentence written by this service.
    `headers` are extra response headers (e.g. `WWW-Authenticate`).
    """

    def __init__(
        self,
        code: str,
        detail: str | None = None,
        *,
        headers: dict[str, str] | None = None,
    ) -> None:
        if code not in PROBLEM_CODES:
            raise ValueError(f"unknown problem code {code!r}")
        self.code = code
        self.status = PROBLEM_CODES[code][0]
        self.detail = detail if detail is not None else PROBLEM_CODES[code][1]
        self.headers = headers or {}
        super().__init__(code)

    def to_problem(self, instance: str | None = None) -> dict[str, Any]:
        """The RFC 9457 body: `type`, `title`, `status`, `detail`, `instance`, `code`."""
        return problem_body(self.code, self.detail, instance)


def problem_body(
    code: str, detail: str | None = None, instance: str | None = None
) -> dict[str, Any]:
    """Build a problem object for `code` (a key of `PROBLEM_CODES`).

    Returns `{"type": "about:blank", "title", "status", "detail", "code"}`
    plus `instance` when given.
    """
    status, default_detail = PROBLEM_CODES[code]
    body: dict[str, Any] = {
        "type": "about:blank",
        "title": HTTPStatus(status).phrase,
        "status": status,
        "detail": detail if detail is not None else default_detail,
        "code": code,
    }
    if instance is not None:
        body["instance"] = instance
    return body


def problem_response(
    error: ProblemError, instance: str | None = None, headers: dict[str, str] | None = None
) -> JSONResponse:
    """An HTTP response carrying `error` as `application/problem+json`."""
    all_headers = dict(error.headers)
    if headers:
        all_headers.update(headers)
    return JSONResponse(
        error.to_problem(instance),
        status_code=error.status,
        media_type=PROBLEM_MEDIA_TYPE,
        headers=all_headers,
    )
