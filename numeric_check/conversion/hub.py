"""The Hugging Face hub as tcircuits meets it: the environment variables its libraries read (checked
before they are imported, each bad one a line), whether the hub can be reached, offline mode, and what
the cache holds. Loading a folder: :mod:`numeric_check.conversion.load`.
"""

from __future__ import annotations

import os
import socket
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlparse

from numeric_check.errors import ModelLoadError

HUB_TIMEOUT_S = 3.0  # the quick look whether the hub can be reached at all

#: Environment variables the Hugging Face libraries read as URLs (the hub, and the proxies httpx goes
#: through) or as numbers when they are imported: each is checked first (:func:`check_hub_environment`).
HUB_URLS = ("HF_ENDPOINT",)
PROXIES = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")
HUB_NUMBERS = ("HF_HUB_ETAG_TIMEOUT", "HF_HUB_DOWNLOAD_TIMEOUT")
_PROXY_SCHEMES = ("http", "https", "socks4", "socks5", "socks5h")


def check_hub_environment(environ=None) -> None:
    """Every environment variable the Hugging Face libraries read as a URL or a number, checked
    before they are imported: one :class:`ModelLoadError` line naming a bad one
    (``HF_ENDPOINT='http://[::1'``, a proxy with port 99999, ``HF_HUB_ETAG_TIMEOUT=abc``), never
    their traceback.

    >>> check_hub_environment({"HF_ENDPOINT": "http://[::1"})
    Traceback (most recent call last):
    ...
    numeric_check.errors.ModelLoadError: the environment variable HF_ENDPOINT='http://[::1' is not a usable URL: Invalid IPv6 URL
    """
    env = os.environ if environ is None else environ
    for name in HUB_URLS + PROXIES:
        value = env.get(name)
        if value is not None and (value != "" or name in HUB_URLS):
            _url(name, value, proxy=name in PROXIES)
    for name in HUB_NUMBERS:
        value = env.get(name)
        if value is not None and not (value.strip().isascii() and value.strip().isdigit() and len(value.strip()) <= 9):
            raise ModelLoadError(f"the environment variable {name}={_quoted(value)} is not a whole number of seconds")


def _quoted(value: str) -> str:
    from tensoralg.escape import terminal_safe

    return terminal_safe(repr(value if len(value) <= 120 else value[:120] + "…"))


def _url(name: str, value: str, proxy: bool) -> tuple[str, int]:
    """``(host, port)`` of the URL in the variable ``name`` (a proxy may leave out ``http://``)."""
    text = value.strip()
    if proxy and "://" not in text:
        text = "http://" + text
    try:
        parts = urlparse(text)
        host, port = parts.hostname, parts.port
    except ValueError as error:
        raise ModelLoadError(f"the environment variable {name}={_quoted(value)} is not a usable URL: {error}") from None
    schemes = _PROXY_SCHEMES if proxy else ("http", "https")
    if parts.scheme not in schemes or not host:
        raise ModelLoadError(f"the environment variable {name}={_quoted(value)} is not a usable URL: expected "
                             f"{' or '.join(s + '://' for s in schemes[:2])}HOST[:PORT]")
    return host, port or (443 if parts.scheme == "https" else 80)


def hub_reachable(timeout: float = HUB_TIMEOUT_S) -> bool:
    """Whether the Hugging Face hub (or the proxy in front of it) answers a TCP connection within
    ``timeout`` seconds; ``False`` at once when ``HF_HUB_OFFLINE`` is set. The variables it reads are
    checked first (:func:`check_hub_environment`)."""
    check_hub_environment()
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return False
    proxy = next((name for name in ("HTTPS_PROXY", "https_proxy") if os.environ.get(name)), None)
    host, port = _url(proxy, os.environ[proxy], proxy=True) if proxy else _url("HF_ENDPOINT", constants.ENDPOINT, False)
    try:
        socket.create_connection((host, port), timeout=timeout).close()
        return True
    except (OSError, ValueError):
        return False


@contextmanager
def hub_offline(offline: bool = True):
    """Within the block, huggingface_hub (and what uses it: transformers, TransformerLens) reads the
    cache only and never retries a network it cannot reach."""
    from huggingface_hub import constants

    if not offline:
        yield
        return
    was_env, was = os.environ.get("HF_HUB_OFFLINE"), constants.HF_HUB_OFFLINE
    os.environ["HF_HUB_OFFLINE"], constants.HF_HUB_OFFLINE = "1", True
    try:
        yield
    finally:
        constants.HF_HUB_OFFLINE = was
        if was_env is None:
            os.environ.pop("HF_HUB_OFFLINE", None)
        else:
            os.environ["HF_HUB_OFFLINE"] = was_env


def offline_message(name: str) -> str:
    """Why a hub name could not be loaded offline, naming the cache it was looked for in."""
    from huggingface_hub import constants

    why = "HF_HUB_OFFLINE is set" if constants.HF_HUB_OFFLINE else f"{urlparse(constants.ENDPOINT).hostname} cannot be reached"
    return (f"{name!r} is not in the Hugging Face cache ({constants.HF_HUB_CACHE}) and {why}; download it where there is "
            f"a network (hf download {name}) or give the folder it was saved in")


def cache_holds_models() -> bool:
    """Whether the Hugging Face cache holds any model at all (when it holds none, nothing can be
    loaded offline, whatever a library would map a name to)."""
    from huggingface_hub import constants

    try:
        return any(Path(constants.HF_HUB_CACHE).glob("models--*"))
    except OSError:
        return True  # unreadable: let the library say
