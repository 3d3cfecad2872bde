"""The gateway's exception tree. Behaviour lives on the class, not in callers' if/else.

    GatewayError                     status, type, code, param, retry_after
    ├── InvalidRequestError          400  the client's request is wrong (never falls back)
    │   └── ContextLengthError       400  prompt + output do not fit the model
    ├── AuthenticationError          401
    ├── PermissionDeniedError        403
    ├── ModelNotFoundError           404  unknown model alias
    ├── PayloadTooLargeError         413
    ├── RateLimitError               429  the gateway's own limits (quotas, admission queue)
    ├── ServiceUnavailableError      503  shared state unreachable (fail closed), draining
    ├── NoTargetAvailableError       503  every target was skipped before a call
    ├── ClientClosedError            499  the client left while its request was being read
    ├── AllTargetsFailedError        429 | 502 | 504, from the failures it collects
    └── ProviderError                a call to one upstream failed
        ├── UpstreamTimeoutError     504  fallback_ok
        ├── UpstreamConnectError     502  retryable, fallback_ok
        ├── UpstreamRateLimitedError 429  fallback_ok, retry_after
        ├── UpstreamAuthError        502  the gateway's credentials were refused; fallback_ok
        ├── UpstreamBadRequestError  400  the upstream rejected the request; never falls back
        ├── UpstreamServerError      502  5xx and unexpected statuses; fallback_ok
        └── UpstreamMalformedError   502  the payload broke the vendor's format; fallback_ok

``retryable`` means: try the same target again (with backoff). ``fallback_ok`` means: moving
on to the next target may succeed where this one failed.
"""

from __future__ import annotations

from collections.abc import Sequence


class GatewayError(Exception):
    """Base error; renders as OpenAI's ``{"error": {...}}`` with ``status``."""

    status: int = 500
    type: str = "server_error"
    code: str | None = None
    retryable: bool = False
    fallback_ok: bool = False

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code
        self.retry_after = retry_after
        self.headers: dict[str, str] = {}  # extra response headers (x-ratelimit-*)
        # Which gate refused, for metrics (never sent): "quota:<limit>", "queue:full",
        # "queue:deadline", "quota:store_down"; None for other errors.
        self.refused_by: str | None = None


class InvalidRequestError(GatewayError):
    status = 400
    type = "invalid_request_error"


class ContextLengthError(InvalidRequestError):
    code = "context_length_exceeded"


class AuthenticationError(GatewayError):
    status = 401
    type = "authentication_error"
    code = "invalid_api_key"


class PermissionDeniedError(GatewayError):
    status = 403
    type = "permission_error"


class ModelNotFoundError(GatewayError):
    status = 404
    type = "invalid_request_error"
    code = "model_not_found"


class PayloadTooLargeError(GatewayError):
    status = 413
    type = "invalid_request_error"
    code = "payload_too_large"


class RateLimitError(GatewayError):
    status = 429
    type = "rate_limit_error"
    code = "rate_limit_exceeded"


class ServiceUnavailableError(GatewayError):
    status = 503
    type = "server_error"
    code = "service_unavailable"


class ClientClosedError(GatewayError):
    """The client went away before its request was read (nginx's 499): nobody gets the
    answer; the status is for the log line."""

    status = 499
    type = "client_closed"


class NoTargetAvailableError(GatewayError):
    status = 503
    type = "server_error"
    code = "no_target_available"


class ProviderError(GatewayError):
    """A failed call to one upstream. ``provider`` names the configured provider."""

    type = "upstream_error"

    def __init__(
        self,
        message: str,
        *,
        provider: str = "",
        upstream_status: int | None = None,
        param: str | None = None,
        code: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message, param=param, code=code, retry_after=retry_after)
        self.provider = provider
        self.upstream_status = upstream_status


class UpstreamTimeoutError(ProviderError):
    status = 504
    type = "timeout_error"
    code = "upstream_timeout"
    fallback_ok = True


class AttemptDeadlineError(UpstreamTimeoutError):
    """The gateway gave up on an attempt that had not started answering by the time the
    request's latency objective needed it to (to leave the next target time to meet it).
    Says the target was slow for this request, not that it failed: breakers ignore it;
    latency statistics take the wait as a lower bound of its TTFT."""

    code = "slo_deadline"


class UpstreamConnectError(ProviderError):
    status = 502
    code = "upstream_unreachable"
    retryable = True
    fallback_ok = True


class UpstreamRateLimitedError(ProviderError):
    status = 429
    type = "rate_limit_error"
    code = "upstream_rate_limited"
    fallback_ok = True


class UpstreamAuthError(ProviderError):
    status = 502
    code = "upstream_auth_failed"
    fallback_ok = True


class UpstreamBadRequestError(ProviderError):
    status = 400
    type = "invalid_request_error"


class UpstreamServerError(ProviderError):
    status = 502
    code = "upstream_error"
    fallback_ok = True


class UpstreamMalformedError(ProviderError):
    status = 502
    code = "upstream_malformed_response"
    fallback_ok = True


class AllTargetsFailedError(GatewayError):
    """Every target of a model was tried and failed; ``failures`` holds each one's error.

    The status follows the failures: all rate-limited -> 429 with the smallest Retry-After;
    all timed out -> 504; otherwise 502.
    """

    def __init__(self, model: str, failures: Sequence[ProviderError]) -> None:
        self.failures = list(failures)
        summary = "; ".join(f"{f.provider or '?'}: {f.message}" for f in self.failures)
        super().__init__(f"All targets for model '{model}' failed: {summary}")
        kinds = {type(f) for f in self.failures}
        if kinds == {UpstreamRateLimitedError}:
            self.status, self.type, self.code = 429, "rate_limit_error", "upstream_rate_limited"
            waits = [f.retry_after for f in self.failures if f.retry_after is not None]
            self.retry_after = min(waits) if waits else 1.0
        elif kinds == {UpstreamTimeoutError}:
            self.status, self.type, self.code = 504, "timeout_error", "upstream_timeout"
        else:
            self.status, self.type, self.code = 502, "upstream_error", "all_targets_failed"
