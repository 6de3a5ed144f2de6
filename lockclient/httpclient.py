"""HTTP clients for timesvc and leasewatch, built only when needed and only as heavy as needed.

``import lockclient`` does not import httpx (an application on the embedded store never talks
HTTP): the clients import it when they are built. And a client whose URLs are all ``http://``
never builds a TLS context — httpx builds one per client by default, loading the CA bundle
(~70 ms each: two of them were a quarter of ``lockctl run -- true``'s 0.7 s in issue 25).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import httpx

__all__ = ["async_client", "client", "http_errors"]


def _plain(urls: Sequence[str]) -> bool:
    return all(url.startswith("http://") for url in urls)


def client(urls: Sequence[str], *, transport: httpx.BaseTransport | None = None, **options: Any) -> httpx.Client:
    """An ``httpx.Client`` for ``urls``; over plain HTTP, its transport skips the TLS context."""
    import httpx

    if transport is None and _plain(urls):
        transport = httpx.HTTPTransport(verify=False)  # only ever talks to http:// URLs: nothing to verify
    return httpx.Client(transport=transport, **options)


def async_client(
    urls: Sequence[str], *, transport: httpx.AsyncBaseTransport | None = None, **options: Any
) -> httpx.AsyncClient:
    """:func:`client` for asyncio."""
    import httpx

    if transport is None and _plain(urls):
        transport = httpx.AsyncHTTPTransport(verify=False)
    return httpx.AsyncClient(transport=transport, **options)


def http_errors() -> tuple[type[Exception], ...]:
    """What a failed request raises (``httpx.HTTPError``), for an ``except`` clause."""
    import httpx

    return (httpx.HTTPError,)
