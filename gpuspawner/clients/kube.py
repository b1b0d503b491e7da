"""The one way gpuspawner reads the Kubernetes API: checked, paged and retried.

Every caller (the spawner's usage check, the culler, the admin service, the
inventory's watches) reads through here, so the traps are handled once:

- ``kubernetes_asyncio`` returns the raw response, and does **not** raise, when
  a call is made with ``_preload_content=False`` (which we do, to read plain
  JSON rather than building model objects for thousands of pods). An
  unchecked 403 then reads as "no pods". :func:`check` turns every status
  outside 2xx into a typed :class:`KubeError`: :class:`Refused` (401/403),
  :class:`NotFound` (404), :class:`Expired` (410, a ``continue`` token or
  ``resourceVersion`` too old: list again) and :class:`Retryable` (429, 5xx,
  and transport errors and timeouts).
- One :class:`RetryPolicy` — exponential back-off under a deadline — retries
  :class:`Retryable` only, as kopf's ``api.request`` does; a refusal is
  never retried.
- Lists are read in pages (``limit``/``continue``), so a large cluster never
  arrives as one huge response.

Client construction (in-cluster service account or kubeconfig) and namespace
discovery live here too.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

SERVICE_ACCOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"

#: The namespace used when neither $POD_NAMESPACE nor a service account names one
#: (zero-to-jupyterhub's default release namespace).
FALLBACK_NAMESPACE = "jupyterhub"

T = TypeVar("T")

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------
# typed errors
# ---------------------------------------------------------------------------


class KubeError(Exception):
    """A Kubernetes API request failed; ``status`` is the HTTP status (None: no answer)."""

    def __init__(self, message: str, status: int | None = None, reason: str = ""):
        super().__init__(message)
        self.status = status
        #: The ``reason`` of the API server's Status object ("Forbidden", "Expired", …).
        self.reason = reason


class Refused(KubeError):
    """401 or 403: the credentials are missing, wrong or lack a permission. Never retried."""


class NotFound(KubeError):
    """404: the object or namespace does not exist."""


class Expired(KubeError):
    """410: the ``continue`` token or ``resourceVersion`` is too old; list again from scratch."""


class Retryable(KubeError):
    """Worth trying again: 429, a 5xx answer, a transport error or a timeout."""


def error_for(status: int | None, body: bytes | str | Mapping | None, what: str) -> KubeError:
    """The typed error for an answer with ``status`` (None: no answer) to the request ``what``."""
    detail, reason = _status_detail(body)
    if status is None:
        return Retryable(f"{what} got no answer: {detail}", None, reason)
    message = f"{what} failed with HTTP {status}" + (f": {detail}" if detail else "")
    if status in (401, 403):
        return Refused(message, status, reason)
    if status == 404:
        return NotFound(message, status, reason)
    if status == 410:
        return Expired(message, status, reason)
    if status == 429 or status >= 500:
        return Retryable(message, status, reason)
    return KubeError(message, status, reason)


def _status_detail(body: bytes | str | Mapping | None) -> tuple[str, str]:
    """(message, reason) of a Kubernetes Status body, or the start of a body that is not one."""
    if body is None:
        return "", ""
    if isinstance(body, Mapping):
        return str(body.get("message") or ""), str(body.get("reason") or "")
    if isinstance(body, bytes):
        body = body.decode(errors="replace")
    try:
        data = json.loads(body)
    except ValueError:
        return " ".join(body.split())[:200], ""
    if isinstance(data, Mapping):
        return str(data.get("message") or ""), str(data.get("reason") or "")
    return "", ""


def _transport_errors() -> tuple[type[BaseException], ...]:
    errors: tuple[type[BaseException], ...] = (OSError, asyncio.TimeoutError)
    try:
        import aiohttp

        errors += (aiohttp.ClientError,)
    except ImportError:  # pragma: no cover - aiohttp comes with kubernetes_asyncio
        pass
    return errors


def _api_exception_status(error: BaseException) -> tuple[int, Any] | None:
    """(status, body) of a ``kubernetes_asyncio`` ApiException, for calls made with preloading."""
    try:
        from kubernetes_asyncio.client.exceptions import ApiException
    except ImportError:  # pragma: no cover
        return None
    if isinstance(error, ApiException) and error.status:
        return int(error.status), error.body
    return None


async def check(response: Any, what: str) -> bytes:
    """The body of a raw (``_preload_content=False``) response; raises :class:`KubeError` unless 2xx.

    The connection goes back to the pool whatever happens.
    """
    try:
        body = await response.read()
    finally:
        release = getattr(response, "release", None)
        if release is not None:
            release()
    if not 200 <= response.status < 300:
        raise error_for(response.status, body, what)
    return body


def check_status(response: Any, what: str) -> None:
    """For a streamed response (a watch): raise before reading when the status is not 2xx."""
    if not 200 <= response.status < 300:
        raise error_for(response.status, None, what)


async def request_json(
    call: Callable[..., Awaitable[Any]], *args: Any, what: str, timeout: float, **kwargs: Any
) -> dict:
    """One API call (``call(*args, **kwargs)``), its status checked, its body as JSON.

    Transport errors and timeouts become :class:`Retryable`; an answer that is
    not JSON is a :class:`KubeError`.
    """
    try:
        response = await call(*args, _preload_content=False, _request_timeout=timeout, **kwargs)
        body = await check(response, what)
    except KubeError:
        raise
    except _transport_errors() as e:
        raise Retryable(f"{what} got no answer: {type(e).__name__}: {e}".rstrip(": ")) from e
    except Exception as e:
        answered = _api_exception_status(e)
        if answered is None:
            raise
        raise error_for(answered[0], answered[1], what) from e
    try:
        data = json.loads(body)
    except ValueError:
        raise KubeError(f"{what} answered something that is not JSON", 200) from None
    if not isinstance(data, dict):
        raise KubeError(f"{what} answered JSON that is not an object", 200)
    return data


# ---------------------------------------------------------------------------
# retries
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential back-off under a deadline, for :class:`Retryable` errors only.

    The delays are ``first_delay``, doubled each time up to ``max_delay``; no
    attempt is started that could only end after ``timeout`` seconds from the
    first (None: retry for ever, as a reflector that has no caller to fail to).
    """

    timeout: float | None = 30.0
    first_delay: float = 0.2
    max_delay: float = 5.0

    def delays(self) -> Iterator[float]:
        delay = self.first_delay
        while True:
            yield delay
            delay = min(delay * 2, self.max_delay)

    async def run(
        self,
        attempt: Callable[[], Awaitable[T]],
        logger: logging.Logger | None = None,
    ) -> T:
        """``await attempt()``, again after each :class:`Retryable` while the deadline allows."""
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        for delay in self.delays():
            try:
                return await attempt()
            except Retryable as e:
                if deadline is not None and time.monotonic() + delay > deadline:
                    raise
                (logger or log).warning("%s; retrying in %.1fs", e, delay)
            await asyncio.sleep(delay)
        raise AssertionError("unreachable: delays() never ends")  # pragma: no cover


# ---------------------------------------------------------------------------
# listing
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Listing:
    """Every object of one list, and the list's resourceVersion (where a watch starts)."""

    items: list[dict]
    resource_version: str


@dataclass(frozen=True)
class Reader:
    """How lists are read: the retry policy, the timeout of one request, the page size."""

    retry: RetryPolicy = RetryPolicy()
    timeout: float = 30
    page_size: int = 500
    logger: logging.Logger | None = None

    async def pages(
        self, call: Callable[..., Awaitable[Any]], *args: Any, what: str, **kwargs: Any
    ) -> AsyncIterator[dict]:
        """Each page (the List object) of ``call(*args, **kwargs)``, following ``continue``.

        Each page is retried on its own. An expired ``continue`` token is
        :class:`Expired`: the caller lists again from the start.
        """
        token = None
        while True:
            extra = {"_continue": token} if token else {}

            async def attempt(extra: dict = extra) -> dict:
                return await request_json(
                    call,
                    *args,
                    what=what,
                    timeout=self.timeout,
                    limit=self.page_size,
                    **kwargs,
                    **extra,
                )

            page = await self.retry.run(attempt, self.logger)
            yield page
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return

    async def list_all(
        self,
        call: Callable[..., Awaitable[Any]],
        *args: Any,
        what: str,
        reduce: Callable[[dict], Any] | None = None,
        **kwargs: Any,
    ) -> Listing:
        """Every object of ``call(*args, **kwargs)`` (e.g. ``api.list_node``), page by page.

        ``reduce`` turns each raw object into what is kept (so a large list is
        never in memory whole); None keeps the objects.
        """
        items: list[Any] = []
        resource_version = ""
        async for page in self.pages(call, *args, what=what, **kwargs):
            raw = page.get("items") or []
            items.extend(raw if reduce is None else (reduce(item) for item in raw))
            resource_version = (page.get("metadata") or {}).get("resourceVersion", "")
        return Listing(items, resource_version)

    async def pods(
        self, api: Any, *, namespace: str | None, selector: str = "", field_selector: str = ""
    ) -> list[dict]:
        """Pods (raw JSON) of ``namespace`` (None: every namespace) matching the selectors."""
        kwargs = {"label_selector": selector, "field_selector": field_selector}
        kwargs = {key: value for key, value in kwargs.items() if value}
        where = f"namespace {namespace}" if namespace else "all namespaces"
        what = f"Listing pods ({selector or 'all'}) in {where}"
        if namespace:
            listing = await self.list_all(api.list_namespaced_pod, namespace, what=what, **kwargs)
        else:
            listing = await self.list_all(api.list_pod_for_all_namespaces, what=what, **kwargs)
        return listing.items

    async def nodes(self, api: Any) -> list[dict]:
        """Every node (raw JSON)."""
        return (await self.list_all(api.list_node, what="Listing nodes")).items


# ---------------------------------------------------------------------------
# where we run, and the client
# ---------------------------------------------------------------------------


def in_cluster() -> bool:
    """Whether this process runs in a pod with a service account."""
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST")) or os.path.exists(
        os.path.join(SERVICE_ACCOUNT, "token")
    )


def service_account_namespace() -> str | None:
    """The pod's own namespace, from its service account (None outside a pod)."""
    try:
        with open(os.path.join(SERVICE_ACCOUNT, "namespace")) as f:
            return f.read().strip() or None
    except OSError:
        return None


def default_namespace() -> str:
    """$POD_NAMESPACE, else the service account's namespace, else ``jupyterhub``."""
    return os.environ.get("POD_NAMESPACE") or service_account_namespace() or FALLBACK_NAMESPACE


def kubernetes_available() -> bool:
    """True in a pod with a service account, or when $KUBECONFIG or ~/.kube/config exists."""
    if in_cluster():
        return True
    path = os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")
    return any(os.path.exists(p) for p in path.split(os.pathsep) if p)


async def core_api() -> Any:
    """A ``kubernetes_asyncio`` ``CoreV1Api`` from the service account, else the kubeconfig.

    The caller closes it (``await api.api_client.close()``).
    """
    from kubernetes_asyncio import client, config

    if in_cluster():
        # The hub passes managed services only a few environment variables,
        # so the API server's address may be missing: use its cluster DNS name.
        os.environ.setdefault("KUBERNETES_SERVICE_HOST", "kubernetes.default.svc")
        os.environ.setdefault("KUBERNETES_SERVICE_PORT", "443")
        config.load_incluster_config()
        api_client = client.ApiClient()
    else:
        api_client = await config.new_client_from_config(config_file=os.environ.get("KUBECONFIG"))
    return client.CoreV1Api(api_client)


class KubeClient:
    """A lazily built ``CoreV1Api`` and the :class:`Reader` the services list with.

    For the services (culler, admin, ``gpuspawner status``); the spawner reads
    through KubeSpawner's shared client with a :class:`Reader` of its own.
    """

    def __init__(self, namespace: str, reader: Reader | None = None):
        self.namespace = namespace
        self.reader = reader or Reader(logger=log)
        self._api: Any = None

    async def api(self) -> Any:
        """The client; raises :class:`KubeError` when no usable configuration is found."""
        if self._api is None:
            try:
                self._api = await core_api()
            except Exception as e:  # kubeconfig missing or broken, service account unreadable
                raise KubeError(f"The Kubernetes client could not be configured: {e}") from e
        return self._api

    async def list_pods(
        self, selector: str = "", *, all_namespaces: bool = False, field_selector: str = ""
    ) -> list[dict]:
        namespace = None if all_namespaces else self.namespace
        return await self.reader.pods(
            await self.api(), namespace=namespace, selector=selector, field_selector=field_selector
        )

    async def list_nodes(self) -> list[dict]:
        return await self.reader.nodes(await self.api())

    async def annotate_pod(
        self, name: str, namespace: str, annotations: Mapping[str, str | None]
    ) -> None:
        """Set annotations on a pod (None removes one) with one merge patch, retried like a list."""
        api = await self.api()
        body = {"metadata": {"annotations": dict(annotations)}}

        async def attempt() -> dict:
            return await request_json(
                api.patch_namespaced_pod,
                name,
                namespace,
                body,
                what=f"Annotating pod {namespace}/{name}",
                timeout=self.reader.timeout,
            )

        await self.reader.retry.run(attempt, self.reader.logger)

    async def close(self) -> None:
        if self._api is not None:
            await self._api.api_client.close()
            self._api = None
