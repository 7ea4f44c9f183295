"""The download of a registry checkpoint (`download_checkpoint`): from Keras's cache
folder if it is there with the right hash, else from torchvision's server (or
`$KERAS_AUTOSHUFFLE_WEIGHTS_URL`), giving up when the server sends nothing for
`$KERAS_AUTOSHUFFLE_DOWNLOAD_TIMEOUT` seconds, hash-checked, written atomically; and the
partial files a download or conversion writes (`partial_path`, `remove_dead_partials`).
`weights.pretrained` converts what it downloads.
"""

import contextlib
import http.client
import math
import os
import re
import secrets
import socket
import ssl
import stat
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

import keras

from keras_autoshuffle._files import sha256_of
from keras_autoshuffle.applications.weights.registry import (
    CACHE_SUBDIR,
    CHECKPOINTS,
    URL_VARIABLE,
    cache_dir,
)

# Seconds a download waits for the server to connect or send its next bytes (at most
# MAX_TIMEOUT: an hour without a byte is no download, and sockets refuse ~1e10 s).
TIMEOUT_VARIABLE = "KERAS_AUTOSHUFFLE_DOWNLOAD_TIMEOUT"
DEFAULT_TIMEOUT = 60.0
MAX_TIMEOUT = 3600.0
# A partial file (a download, a conversion) is written under a name that carries its
# writer: `.<name>.<host>-<pid namespace>.<pid>.<token>.download`. One whose writer is
# dead (same host and PID namespace, no such process), or that nothing has written for
# STALE_SECONDS (a live download writes at least every timeout, <= MAX_TIMEOUT, seconds;
# this also covers a PID reused since, another host sharing the cache, older versions'
# names), is removed by the next download or conversion into the same folder.
STALE_SECONDS = 2 * MAX_TIMEOUT
_PARTIAL = re.compile(
    r"\.(?P<name>.+)\.(?P<tag>[A-Za-z0-9-]+)\.(?P<pid>[0-9]{1,10})\.(?P<token>[0-9a-f]{8})"
    r"\.(?:download|partial\.weights\.h5)"
)
# Partial names of earlier versions (`.<name>.<pid>.download`): removed once stale.
_OLD_PARTIAL = re.compile(r"\..+\.[0-9]+\.(?:download|partial\.weights\.h5)")
# torchvision's largest ShuffleNetV2 checkpoint (x2.0) has 29 MB; a server sending more is
# not sending it.
MAX_DOWNLOAD_BYTES = 256 * 2**20


def download_timeout() -> float:
    """Seconds a download waits for the server to connect or send its next bytes:
    `$KERAS_AUTOSHUFFLE_DOWNLOAD_TIMEOUT` when set (a number > 0, at most 3600), else 60."""
    text = os.environ.get(TIMEOUT_VARIABLE, "").strip()
    if not text:
        return DEFAULT_TIMEOUT
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and 0 < value <= MAX_TIMEOUT):
        raise ValueError(
            f"The environment variable {TIMEOUT_VARIABLE} must be a number of seconds > 0 "
            f"and at most {MAX_TIMEOUT:g} (how long a download waits for the server). "
            f"Received: {TIMEOUT_VARIABLE}={text!r}"
        )
    return value


def _convert_by_hand(entry, width):
    """The offline recipe that every download error ends with."""
    return (
        f"Offline: download {entry.url} elsewhere and either put it at "
        f"{os.path.join(cache_dir(), CACHE_SUBDIR, entry.file_name)}, or set {URL_VARIABLE} to "
        "the folder or mirror that holds it (file:///path/to/folder works), or convert it by "
        f"hand with the command `autoshuffle-convert-weights {entry.file_name} "
        f"x{width:g}.weights.h5` and pass weights='x{width:g}.weights.h5' (shufflenet_v2 "
        "builders with stem='imagenet')."
    )


class _Stalled(OSError):
    """The server stopped sending (see `_fetch`)."""


class _CutShort(OSError):
    """The connection closed before the bytes the server announced had come."""


def _content_length(response):
    """The byte count a response announces (`Content-Length`), or None (absent, not a
    decimal number, several different values)."""
    values = {v.strip() for v in response.headers.get_all("Content-Length") or ()}
    if len(values) != 1:
        return None
    (text,) = values
    return int(text) if re.fullmatch(r"[0-9]{1,20}", text) else None


def _writer_tag():
    """Where this process runs: its host and PID namespace (`<host>-<namespace>`); a PID
    means this process only under the same tag."""
    host = re.sub(r"[^A-Za-z0-9-]", "-", socket.gethostname())[:64] or "host"
    try:
        namespace = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        namespace = 0
    return f"{host}-{namespace}"


def partial_path(folder: str, name: str, suffix: str = "download") -> str:
    """A fresh name in `folder` to write `name` under before it is moved into place:
    `.<name>.<writer tag>.<pid>.<token>.<suffix>` (see `STALE_SECONDS`)."""
    token = secrets.token_hex(4)
    return os.path.join(folder, f".{name}.{_writer_tag()}.{os.getpid()}.{token}.{suffix}")


def _alive(pid):
    """Whether a process `pid` exists here (a process of another user counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (OSError, OverflowError, ValueError):
        return True  # not ours to signal, or not a PID we can judge: keep its file
    return True


def remove_dead_partials(folder: str) -> list[str]:
    """Removes from `folder` the partial files (`partial_path`) of writers that are dead
    or that nothing has written for `STALE_SECONDS`; returns their names. A live
    writer's file, here or on another host, is kept."""
    removed = []
    try:
        names = os.listdir(folder)
    except OSError:
        return removed
    tag, now = _writer_tag(), time.time()
    for name in names:
        match = _PARTIAL.fullmatch(name)
        if match is None and _OLD_PARTIAL.fullmatch(name) is None:
            continue
        path = os.path.join(folder, name)
        try:
            status = os.lstat(path)
        except OSError:
            continue
        if stat.S_ISDIR(status.st_mode):
            continue
        dead = (
            match is not None
            and match["tag"] == tag
            and int(match["pid"]) != os.getpid()
            and not _alive(int(match["pid"]))
        )
        if dead or now - status.st_mtime > STALE_SECONDS:
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)
                removed.append(name)
    return removed


class _HeaderDeadline:
    """Bounds the time until a response's headers have come, redirects included: a server
    sending its header one byte at a time (each byte within the socket's timeout) would
    otherwise hold `urlopen` for as long as it likes. Every connection `opener()` makes is
    shut down when `seconds` have passed and the headers are not all there."""

    def __init__(self, seconds):
        self.sockets, self.lock, self.expired = [], threading.Lock(), False
        self.timer = threading.Timer(seconds, self._expire)
        self.timer.daemon = True

    def _expire(self):
        with self.lock:
            self.expired = True
            for sock in self.sockets:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def _record(self, connection_class):
        deadline = self

        class Connection(connection_class):
            def connect(self):
                super().connect()
                with deadline.lock:
                    deadline.sockets.append(self.sock)
                    if deadline.expired:
                        self.sock.shutdown(socket.SHUT_RDWR)

        return Connection

    def opener(self):
        deadline = self

        class HTTPHandler(urllib.request.HTTPHandler):
            def http_open(self, request):
                return self.do_open(deadline._record(http.client.HTTPConnection), request)

        class HTTPSHandler(urllib.request.HTTPSHandler):
            # The context kept here, not read back from the handler (a private attribute):
            # the certificates checked and the host name matched, as urllib's default.
            def __init__(self):
                self.ssl_context = ssl.create_default_context()
                super().__init__(context=self.ssl_context)

            def https_open(self, request):
                connection = deadline._record(http.client.HTTPSConnection)
                return self.do_open(connection, request, context=self.ssl_context)

        return urllib.request.build_opener(HTTPHandler, HTTPSHandler)

    def __enter__(self):
        self.timer.start()
        return self

    def __exit__(self, *_):
        self.timer.cancel()
        with self.lock:
            self.sockets.clear()  # the body's reads are bounded by `_fetch` itself


def _fetch(url, target, timeout):
    """Writes what `url` serves into the file `target`, at most `MAX_DOWNLOAD_BYTES`.

    Gives up (`_Stalled`) when the server takes more than `timeout` seconds to connect
    or to send anything, takes more than `timeout` seconds in all to send its response's
    headers (redirects included), or sends less than 64 KiB in any `timeout` seconds (a
    trickle would hold the call as long as a stall). A file: URL must name a regular file
    (a FIFO would block).
    """
    parts = urllib.parse.urlsplit(url)
    if parts.scheme == "file":
        local = urllib.request.url2pathname(parts.path)
        if os.path.exists(local) and not os.path.isfile(local):
            raise OSError(f"{local} is not a regular file")
    deadline = _HeaderDeadline(timeout)
    try:
        with deadline:
            response = deadline.opener().open(url, timeout=timeout)
        if deadline.expired:  # the headers were cut at the deadline: what came is no answer
            response.close()
            raise _Stalled(f"the response's headers took more than {timeout:g} s")
    except _Stalled:
        raise
    except TimeoutError:  # connected, no answer
        raise _Stalled(f"no answer within {timeout:g} s") from None
    except (OSError, http.client.HTTPException) as error:
        if deadline.expired:
            raise _Stalled(f"the response's headers took more than {timeout:g} s") from None
        if isinstance(error, urllib.error.URLError) and isinstance(error.reason, TimeoutError):
            raise _Stalled(f"no connection within {timeout:g} s") from None
        raise
    length = _content_length(response)
    if length is not None and length > MAX_DOWNLOAD_BYTES:
        response.close()
        raise OSError(
            f"the server announces {length} bytes (Content-Length), more than the "
            f"{MAX_DOWNLOAD_BYTES} a checkpoint can have; nothing was downloaded"
        )
    # The bar counts bytes; its ETA comes from a length the server announced (bounded
    # above), else the bar has no target and shows no ETA.
    progress = keras.utils.Progbar(length or None, unit_name="bytes")
    received, window, window_start = 0, 0, time.monotonic()
    with response, open(target, "wb") as out:
        while True:
            try:
                block = response.read1(1 << 16)
            except TimeoutError:
                raise _Stalled(f"nothing sent for {timeout:g} s after {received} bytes") from None
            except http.client.IncompleteRead:  # a chunked response cut short
                raise _CutShort(
                    f"the download was cut short after {received} bytes (the connection "
                    "closed inside a chunk)"
                ) from None
            if not block:
                if length is not None and received < length:
                    raise _CutShort(
                        f"the download was cut short: received {received} of {length} bytes "
                        "(the connection closed early)"
                    )
                return
            received, window = received + len(block), window + len(block)
            if received > MAX_DOWNLOAD_BYTES:
                raise OSError(f"the server sent more than {MAX_DOWNLOAD_BYTES} bytes")
            out.write(block)
            progress.update(received)
            if window >= 1 << 16:
                window, window_start = 0, time.monotonic()
            elif time.monotonic() - window_start > timeout:
                raise _Stalled(f"under 64 KiB sent in {timeout:g} s after {received} bytes")


def download_checkpoint(width: float, weights: str = "imagenet") -> str:
    """The path of torchvision's checkpoint for `width` in Keras's cache, downloaded if it
    is not there, its SHA-256 checked.

    A download waits at most `download_timeout()` seconds for the server to connect or
    to send its next bytes (`$KERAS_AUTOSHUFFLE_DOWNLOAD_TIMEOUT`, 60 by default).

    Args:
        width: a key of `CHECKPOINTS`.
        weights: what the builder was given ("imagenet" or the entry's name), for the
            errors' `Received: weights=...`.

    Returns:
        The path of the checked `.pth` file under `<cache>/models`.
    """
    entry = CHECKPOINTS[width]
    expected = entry.sha256.lower()
    base = cache_dir()
    path = os.path.join(base, CACHE_SUBDIR, entry.file_name)
    rejected = ""  # what is said of a file already in the cache that fails the check
    if os.path.lexists(path) and not os.path.isfile(path):
        raise ValueError(
            f"{path}, where torchvision's checkpoint is cached, is not a regular file (a "
            "folder, FIFO or broken link): delete it, or replace it with torchvision's "
            f"file {entry.file_name}. Received: weights={weights!r}"
        )
    if os.path.isfile(path):
        digest = sha256_of(path)
        if digest.startswith(expected):
            return path
        rejected = (
            f"The file already at {path} failed its hash check (SHA-256 {digest}; "
            f"torchvision's starts with {expected}): it is damaged or another file, so it "
            "was not used; replace it with torchvision's file (or delete it). "
        )
    url = entry.url
    timeout = download_timeout()
    folder = os.path.join(base, CACHE_SUBDIR)
    remove_dead_partials(folder)  # what killed downloads left
    # Renamed to `path` once its hash is right; one name per download (its writer's host,
    # PID and a random token), so two downloads at once never write into the same file.
    download = partial_path(folder, entry.file_name)
    try:
        _fetch(url, download, timeout)
    except (OSError, http.client.HTTPException, ValueError) as error:
        if os.path.exists(download):
            os.remove(download)
        if isinstance(error, _Stalled):
            cause = (
                f"the server stalled ({error}). Set {TIMEOUT_VARIABLE} to a number of "
                f"seconds to wait longer (it is {timeout:g}), or {URL_VARIABLE} to another "
                "mirror."
            )
        elif isinstance(error, _CutShort):
            cause = (
                f"{error}: nothing was cached. Try again, or set {URL_VARIABLE} to another mirror."
            )
        else:
            cause = f"{type(error).__name__}: {error}."
        raise OSError(
            f"Could not download torchvision's ImageNet ShuffleNetV2 x{width:g} weights from "
            f"{url}: {cause} {rejected}{_convert_by_hand(entry, width)} "
            f"Received: weights={weights!r}"
        ) from None
    digest = sha256_of(download)
    if not digest.startswith(expected):
        os.remove(download)
        raise ValueError(
            f"The file downloaded from {url} is not torchvision's checkpoint: its SHA-256 is "
            f"{digest}, torchvision's starts with {expected}. It was deleted; nothing was "
            f"cached. A mirror set with {URL_VARIABLE} must serve the original file. "
            f"{_convert_by_hand(entry, width)} Received: SHA-256 {digest}"
        )
    os.replace(download, path)
    return path
