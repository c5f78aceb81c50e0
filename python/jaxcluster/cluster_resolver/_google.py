"""Google Cloud plumbing for the GCE and Cloud TPU resolvers: credentials, an authorised HTTPS
session with timeouts and bounded retries, and errors that say what to fix.

Plain JSON over ``google-auth``'s ``AuthorizedSession``; no discovery client, no oauth2client.

Example::

    api = GoogleAPI("Compute Engine API", "https://compute.googleapis.com/compute/v1/",
                    credentials="default")
    api.call("GET", "projects/p/zones/z/instances/vm-1", what="reading instance 'vm-1'",
             permission="compute.instances.get")
"""

from __future__ import annotations

import os
import random
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from jaxcluster._extras import require
from jaxcluster.errors import (
    DeadlineExceededError,
    JaxClusterError,
    UnauthenticatedError,
    UnavailableError,
)

if TYPE_CHECKING:
    import requests

__all__ = [
    "CLOUD_PLATFORM_SCOPE",
    "DEFAULT_API_TIMEOUT",
    "Backoff",
    "GoogleAPI",
    "GoogleAPIError",
    "check_base_url",
    "describe_credentials",
    "env_timeout",
    "load_credentials",
    "make_session",
    "positive_timeout",
    "snippet",
]

CLOUD_PLATFORM_SCOPE = "https://www.googleapis.com/auth/cloud-platform"
#: Seconds one API request may take when the resolver is given no ``timeout=``.
DEFAULT_API_TIMEOUT = 30.0
_RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
# A Retry-After longer than this is not worth blocking a resolver on; fail and say so instead.
_MAX_RETRY_AFTER = 30.0


class GoogleAPIError(JaxClusterError, RuntimeError):
    """A Google API answered with an HTTP error. ``status`` is the HTTP code, ``reason`` the
    API's status or reason (``"PERMISSION_DENIED"``, ``"notFound"``), ``api_message`` its text."""

    def __init__(
        self,
        message: str,
        *,
        status: int,
        method: str,
        url: str,
        reason: str | None = None,
        api_message: str = "",
    ) -> None:
        super().__init__(message)
        self.status = status
        self.method = method
        self.url = url
        self.reason = reason
        self.api_message = api_message


@dataclass(frozen=True)
class Backoff:
    """Bounded retries: ``attempts`` tries in all, sleeping ``initial * 2**n`` (capped at
    ``maximum``, with jitter) between them."""

    attempts: int = 4
    initial: float = 0.25
    maximum: float = 4.0

    def delay(self, retry: int) -> float:
        base = min(self.maximum, self.initial * (2**retry))
        # Full jitter would allow a zero wait; keep at least half the step.
        return base * (0.5 + random.random() / 2)


def positive_timeout(value: object, name: str = "timeout") -> float:
    """``value`` as seconds; ``ValueError`` naming ``name`` unless a positive number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{name} must be a positive number of seconds; got {value!r}")
    return float(value)


def load_credentials(credentials: object) -> Any:
    """``'default'`` (or ``None``, as in TF) → Application Default Credentials with the
    cloud-platform scope; a ``google.auth.credentials.Credentials`` → itself."""
    require("gcp", "google.auth", "Google Cloud credentials")
    import google.auth
    import google.auth.credentials
    import google.auth.exceptions

    if credentials is None or (isinstance(credentials, str) and credentials == "default"):
        try:
            found, _project = google.auth.default(scopes=[CLOUD_PLATFORM_SCOPE])
        except google.auth.exceptions.DefaultCredentialsError as exc:
            raise ValueError(
                "credentials='default' needs Google Application Default Credentials, and none "
                f"were found ({exc}). Run `gcloud auth application-default login`, set "
                "GOOGLE_APPLICATION_CREDENTIALS to a key file, run on a GCE/TPU VM with a "
                "service account, or pass credentials= a google.auth.credentials.Credentials "
                "(google.auth.credentials.AnonymousCredentials() for a local test server)."
            ) from exc
        return found
    if isinstance(credentials, google.auth.credentials.Credentials):
        return credentials
    hint = ""
    if type(credentials).__module__.startswith("oauth2client"):
        hint = " oauth2client is not supported; use google-auth credentials instead."
    raise TypeError(
        "credentials must be 'default', None or a google.auth.credentials.Credentials; "
        f"got {type(credentials).__module__}.{type(credentials).__qualname__}: "
        f"{credentials!r}.{hint}"
    )


def describe_credentials(credentials: Any) -> str:
    """A short, secret-free description of who the credentials act as."""
    if credentials is None:
        return "a caller-supplied session"
    name = type(credentials).__name__
    if name == "AnonymousCredentials":
        return "anonymous credentials"
    for attr in ("service_account_email", "signer_email", "account"):
        who = getattr(credentials, attr, None)
        if isinstance(who, str) and who and who != "default":
            return f"{name} for {who}"
    return f"{type(credentials).__module__}.{name}"


def make_session(credentials: object, service: object) -> tuple[requests.Session, Any]:
    """The session to call APIs with, and the credentials it applies (``None`` if unknown).

    ``service`` is TF's discovery-client argument; a discovery client is called by the
    resolvers themselves (``_discovery.py``), and here it may be a ``requests.Session`` (e.g.
    an ``AuthorizedSession`` with your own adapters or proxies), used as given.
    """
    requests = require("gcp", "requests", "Calling Google Cloud APIs")
    require("gcp", "google.auth", "Calling Google Cloud APIs")
    if service is not None:
        if isinstance(service, requests.Session):
            return service, getattr(service, "credentials", None)
        raise TypeError(
            "service must be None, one of the googleapiclient discovery clients TF passes "
            "(with the API's collections, e.g. instanceGroups() and instances() for Compute "
            "Engine) or a requests.Session (for example a "
            "google.auth.transport.requests.AuthorizedSession) used for the REST calls; got "
            f"{type(service).__module__}.{type(service).__qualname__}. Or drop service= and "
            "pass credentials= (and api_endpoint= for a non-default endpoint)."
        )
    from google.auth.transport.requests import AuthorizedSession

    creds = load_credentials(credentials)
    return AuthorizedSession(creds), creds


def check_base_url(url: object, name: str) -> str:
    """An ``http(s)://host[:port][/prefix]`` URL, ending with ``/``; ``ValueError`` if not."""
    if not isinstance(url, str) or urlsplit(url).scheme not in ("http", "https"):
        raise ValueError(
            f"{name} must be an http:// or https:// base URL such as "
            f"'https://tpu.googleapis.com/' or 'http://127.0.0.1:8080/'; got {url!r}"
        )
    if not urlsplit(url).netloc:
        raise ValueError(f"{name} {url!r} has no host; expected e.g. 'http://127.0.0.1:8080/'")
    return url if url.endswith("/") else url + "/"


class GoogleAPI:
    """One Google JSON API at ``base_url``: calls with timeout, retries and clear errors.

    The session is created on first use, so constructing a resolver never needs credentials.
    """

    def __init__(
        self,
        name: str,
        base_url: str,
        *,
        credentials: object = "default",
        service: object = None,
        timeout: float = DEFAULT_API_TIMEOUT,
        backoff: Backoff | None = None,
    ) -> None:
        self.name = name
        self.base_url = check_base_url(base_url, "api_endpoint")
        self.timeout = positive_timeout(timeout)
        self.backoff = backoff or Backoff()
        # The clients are an extra: say so when the resolver is made, not at its first call.
        require("gcp", "requests", f"Calling the {name}")
        require("gcp", "google.auth", f"Calling the {name}")
        if service is not None:
            make_session(credentials, service)  # type check now, not on first call
        self._credentials_arg = credentials
        self._service = service
        self._session: requests.Session | None = None
        self._credentials: Any = None

    def session(self) -> requests.Session:
        if self._session is None:
            self._session, self._credentials = make_session(self._credentials_arg, self._service)
        return self._session

    def call(
        self,
        method: str,
        path: str,
        *,
        what: str,
        permission: str,
        params: dict[str, Any] | None = None,
        body: Any = None,
    ) -> dict[str, Any]:
        """``method`` ``base_url + path`` and the decoded JSON object it answers.

        Retries 429/5xx answers and connection failures with backoff; raises
        :class:`GoogleAPIError` for an HTTP error, ``DeadlineExceededError`` when one request
        exceeds the timeout, ``UnavailableError`` when the endpoint cannot be reached.
        """
        import google.auth.exceptions
        import requests

        url = self.base_url + path.lstrip("/")
        session = self.session()
        attempts = self.backoff.attempts
        for attempt in range(attempts):
            last = attempt == attempts - 1
            try:
                response = session.request(
                    method, url, params=params, json=body, timeout=self.timeout
                )
            except google.auth.exceptions.RefreshError as exc:
                raise UnauthenticatedError(
                    f"{self.name}: could not get an access token for {method} {url} ({what}) "
                    f"from the credentials ({describe_credentials(self._credentials)}): {exc}. "
                    "Refresh them (`gcloud auth application-default login`) or pass other "
                    "credentials=."
                ) from exc
            except google.auth.exceptions.TransportError as exc:
                raise UnavailableError(
                    f"{self.name}: the credentials ({describe_credentials(self._credentials)}) "
                    f"could not reach their token endpoint before {method} {url} ({what}): "
                    f"{exc}. Check network access to the token service (on GCE, the metadata "
                    "server)."
                ) from exc
            except requests.Timeout as exc:
                # Not retried: the caller's timeout is the bound on how long a step may block.
                raise DeadlineExceededError(
                    f"{self.name}: {method} {url} ({what}) got no answer within "
                    f"{self.timeout:g}s. Check network access to {_host(url)} (firewall, "
                    "proxy, VPC Service Controls) or pass a larger timeout=."
                ) from exc
            except requests.ConnectionError as exc:
                if last:
                    raise UnavailableError(
                        f"{self.name}: could not connect to {_host(url)} for {method} {url} "
                        f"({what}) after {attempts} attempts: {exc}. Check DNS and network "
                        "access to the endpoint, and api_endpoint= if you set one."
                    ) from exc
                time.sleep(self.backoff.delay(attempt))
                continue
            if response.status_code in _RETRY_STATUSES and not last:
                time.sleep(self._retry_delay(response, attempt))
                continue
            if response.status_code >= 400:
                raise self._http_error(response, method, url, what, permission, attempt + 1)
            return self._decode(response, method, url, what)
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _retry_delay(self, response: requests.Response, attempt: int) -> float:
        header = response.headers.get("Retry-After", "")
        if header.strip().isdigit():
            return min(float(header), _MAX_RETRY_AFTER)
        return self.backoff.delay(attempt)

    def _decode(
        self, response: requests.Response, method: str, url: str, what: str
    ) -> dict[str, Any]:
        try:
            data = response.json()
        except ValueError:
            data = None
        if not isinstance(data, dict):
            raise GoogleAPIError(
                f"{self.name}: {method} {url} ({what}) answered HTTP {response.status_code} "
                f"with a body that is not a JSON object: {snippet(response.text)!r}. Is "
                "api_endpoint pointing at the right service?",
                status=response.status_code,
                method=method,
                url=url,
            )
        return data

    def _http_error(
        self,
        response: requests.Response,
        method: str,
        url: str,
        what: str,
        permission: str,
        attempts: int,
    ) -> GoogleAPIError:
        status = response.status_code
        reason, message, denied = _parse_error(response)
        who = describe_credentials(self._credentials)
        head = f"{self.name}: {method} {url} ({what}) failed with HTTP {status}"
        if reason:
            head += f" {reason}"
        head += f": {message or snippet(response.text) or response.reason}."
        if status == 401:
            hint = (
                f"The credentials ({who}) were not accepted: the token is missing, expired or "
                "revoked. Refresh them (`gcloud auth application-default login`) or pass "
                "other credentials=."
            )
        elif status == 403:
            needed = denied or permission
            hint = (
                f"The caller ({who}) probably lacks the IAM permission {needed!r} on that "
                "resource: grant it a role that includes it. Also check that the API is "
                "enabled in the project and that the project is the one you meant."
            )
        elif status == 404:
            hint = "Check the project, zone and name (and the API version)."
        elif status in _RETRY_STATUSES:
            hint = f"Gave up after {attempts} attempts; the service may be overloaded or down."
            if status == 429:
                hint = f"Rate limit or quota exceeded; gave up after {attempts} attempts."
        else:
            hint = ""
        return GoogleAPIError(
            f"{head} {hint}".rstrip(),
            status=status,
            method=method,
            url=url,
            reason=reason,
            api_message=message,
        )


def _parse_error(response: requests.Response) -> tuple[str | None, str, str | None]:
    """``(reason, message, denied permission)`` from a Google error body, as far as present."""
    try:
        error = response.json().get("error")
    except (ValueError, AttributeError):
        return None, "", None
    if not isinstance(error, dict):
        return None, "", None
    reason = error.get("status")
    errors = error.get("errors")
    if not reason and isinstance(errors, list) and errors and isinstance(errors[0], dict):
        reason = errors[0].get("reason")
    denied = None
    for detail in error.get("details") or []:
        metadata = detail.get("metadata") if isinstance(detail, dict) else None
        if isinstance(metadata, dict) and isinstance(metadata.get("permission"), str):
            denied = metadata["permission"]
    message = error.get("message")
    return (
        reason if isinstance(reason, str) else None,
        message if isinstance(message, str) else "",
        denied,
    )


def _host(url: str) -> str:
    return urlsplit(url).netloc


def snippet(text: str, limit: int = 200) -> str:
    """``text`` on one line, cut to ``limit`` characters, for error messages."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "..."


def env_timeout(name: str, default: float) -> float:
    """Seconds from environment variable ``name`` (``ValueError`` naming it if malformed)."""
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return default
    try:
        return positive_timeout(float(raw), name)
    except ValueError:
        raise ValueError(
            f"environment variable {name}={raw!r} is not a positive number of seconds"
        ) from None
