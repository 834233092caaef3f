"""Runs localstripe (PyPI, a stateful fake Stripe server) for one test: on 127.0.0.1 only, on a
free port it prints as the first line of stdout, with its store kept in memory (localstripe
otherwise pickles every change to /tmp/localstripe.pickle, which concurrent tests would share).
Everything else is localstripe's own code, unchanged."""
import socket

from aiohttp import web

import localstripe.resources

localstripe.resources.Store.dump_to_disk = lambda self: None

from localstripe.server import app  # noqa: E402

sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
sock.bind(("127.0.0.1", 0))
print(sock.getsockname()[1], flush=True)
web.run_app(app, sock=sock, print=None, access_log=None)
